"""A content header that always decodes: whatever a publisher put in a message's properties and headers,
the worker receives the message and keeps its connection.

Why this module exists. aiormq reads frames with pamqp, and pamqp raises on values it cannot turn into
Python ones: a ``timestamp`` (property, or a ``T`` value in a header table) beyond ``datetime``'s range (a
shard that sends microseconds is enough), a short string or table key that is not UTF-8, an unknown field
type, a table nested deeper than Python's recursion limit. aiormq treats any such error as a broken
connection: the connection dies on every delivery of that message, the broker redelivers it, and no other
event is answered until the queue's delivery limit dead-letters it; ``worker dlq`` then fails the same way on
the dead letter. The bytes are well-formed AMQP (every field's length is known); only their *interpretation*
fails.

The adaptation is the smallest that keeps the library's behaviour for every message it already decoded:
:func:`install` wraps ``Basic.Properties.unmarshal`` (what pamqp calls for every content header). The
library's decoder runs first, unchanged; only when it raises does :func:`decode_tolerantly` decode the same
bytes field by field, where a field (or a header table entry) that cannot be read is left out and named in
the :data:`UNDECODABLE` header, e.g. ``["timestamp: 1733256000000000 is out of range"]``. A ``T`` header
value out of range is kept as its integer. The handler logs what was left out and processes the event as
usual (the worker reads no property a shard must set); its retry and dead-letter copies carry the note on
(:mod:`worker.broker.headers`). Upstream, the same change would be pamqp decoding such values to a raw
form instead of raising; until then it lives here.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from pamqp import decode
from pamqp.commands import Basic

from worker.redact import message_of

#: the header under which the decoder names what it left out (set by the decoder only: a publisher's own
#: value for it is discarded)
UNDECODABLE = "x-ltm-undecodable"
#: nested tables and arrays deeper than this are left out whole
MAX_DEPTH = 64
#: at most this many notes are kept (a table of a thousand bad keys gives one line per the first few)
MAX_NOTES = 20
_NOTE_LIMIT = 200

_original_unmarshal: Callable[[Basic.Properties, int, bytes], None] | None = None

#: sizes of the fixed-width field-table value types (the RabbitMQ errata's type letters)
_FIXED: dict[bytes, int] = {
    b"t": 1,
    b"b": 1,
    b"B": 1,
    b"s": 2,
    b"u": 2,
    b"I": 4,
    b"i": 4,
    b"l": 8,
    b"L": 8,
    b"f": 4,
    b"d": 8,
    b"D": 5,
    b"T": 8,
    b"V": 0,
    b"\x00": 0,
}
#: value types that carry their own 32-bit length
_SIZED = frozenset({b"S", b"A", b"F", b"x"})
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


class Truncated(ValueError):
    """A length runs past the end of the frame: the frame itself is broken (a broker never sends one)."""


def install() -> None:
    """Make every content header decode (idempotent). Called before any connection is opened."""
    global _original_unmarshal
    if _original_unmarshal is not None:
        return
    _original_unmarshal = Basic.Properties.unmarshal
    Basic.Properties.unmarshal = _unmarshal  # type: ignore[method-assign,assignment]


def _unmarshal(self: Basic.Properties, flags: int, data: bytes) -> None:
    assert _original_unmarshal is not None
    try:
        _original_unmarshal(self, flags, data)
    except Exception:  # RecursionError included: the library could not read it, so we read it field by field
        decode_tolerantly(self, flags, data)
        return
    headers = self.headers
    if headers and UNDECODABLE in headers:
        del headers[UNDECODABLE]  # only the decoder says what it left out


def decode_tolerantly(properties: Basic.Properties, flags: int, data: bytes) -> None:
    """Fill ``properties`` from ``data`` field by field; what cannot be decoded is left out and noted."""
    notes: list[str] = []
    offset = 0
    for name in properties.__slots__:
        if not flags & properties.flags[name]:
            continue
        kind = getattr(type(properties), "_" + name)
        size = _property_size(kind, data, offset)
        raw = data[offset : offset + size]
        offset += size
        value: Any = None
        try:
            if kind == "table":
                value = _table(raw[4:], "headers", notes, 0)
                value.pop(UNDECODABLE, None)
            elif kind == "timestamp":
                value = _timestamp(raw, name, notes)
            else:
                _, value = decode.by_type(raw, kind)
        except Exception as exc:
            notes.append(_note(f"{name}: {_why(exc)}"))
            value = None
        setattr(properties, name, value)
    if notes:
        headers: dict[str, Any] = properties.headers if isinstance(properties.headers, dict) else {}
        more = [f"(+{len(notes) - MAX_NOTES} more)"] if len(notes) > MAX_NOTES else []
        headers[UNDECODABLE] = notes[:MAX_NOTES] + more
        properties.headers = headers


def _property_size(kind: str, data: bytes, offset: int) -> int:
    if kind == "shortstr":
        size = 1 + _byte_at(data, offset)
    elif kind == "table":
        size = 4 + _u32_at(data, offset)
    elif kind == "octet":
        size = 1
    elif kind == "timestamp":
        size = 8
    else:  # pragma: no cover - Basic.Properties has no other types
        raise Truncated(f"unknown property type {kind}")
    if offset + size > len(data):
        raise Truncated("a property runs past the end of the content header")
    return size


def _table(data: bytes, where: str, notes: list[str], depth: int) -> dict[str, Any]:
    """The entries of a field table's payload ``data``; entries that cannot be read are noted and left out."""
    table: dict[str, Any] = {}
    offset = 0
    while offset < len(data):
        key_length = data[offset]
        raw_key = data[offset + 1 : offset + 1 + key_length]
        offset += 1 + key_length
        key = raw_key.decode("utf-8", errors="replace")
        path = f"{where}.{key}" if where else key
        if offset >= len(data):
            notes.append(_note(f"{path}: no value"))
            break
        try:
            size = _value_size(data, offset)
        except Truncated as exc:
            notes.append(_note(f"{path}: {exc}; the rest of the table is left out"))
            break
        try:
            raw_key.decode("utf-8")
        except UnicodeDecodeError:
            notes.append(_note(f"{path}: the key is not UTF-8"))
        else:
            found, value = _value(data[offset : offset + size], path, notes, depth)
            if found:
                table[key] = value
        offset += size
    return table


def _array(data: bytes, where: str, notes: list[str], depth: int) -> list[Any]:
    items: list[Any] = []
    offset = 0
    index = 0
    while offset < len(data):
        path = f"{where}[{index}]"
        try:
            size = _value_size(data, offset)
        except Truncated as exc:
            notes.append(_note(f"{path}: {exc}; the rest of the array is left out"))
            break
        found, value = _value(data[offset : offset + size], path, notes, depth)
        if found:
            items.append(value)
        offset += size
        index += 1
    return items


def _value(raw: bytes, path: str, notes: list[str], depth: int) -> tuple[bool, Any]:
    """One typed value (type letter first); ``(False, None)`` when it was left out."""
    kind = raw[:1]
    try:
        if kind in (b"F", b"A"):
            if depth + 1 >= MAX_DEPTH:
                notes.append(_note(f"{path}: nested deeper than {MAX_DEPTH} levels"))
                return False, None
            if kind == b"F":
                return True, _table(raw[5:], path, notes, depth + 1)
            return True, _array(raw[5:], path, notes, depth + 1)
        if kind == b"T":
            return True, _timestamp(raw[1:], path, notes, keep_integer=True)
        _, value = decode.embedded_value(raw)
        return True, value
    except Exception as exc:
        notes.append(_note(f"{path}: {_why(exc)}"))
        return False, None


def _value_size(data: bytes, offset: int) -> int:
    """Bytes of the typed value at ``offset``, its type letter included."""
    kind = data[offset : offset + 1]
    if kind in _FIXED:
        size = 1 + _FIXED[kind]
    elif kind in _SIZED:
        size = 5 + _u32_at(data, offset + 1)
    else:
        raise Truncated(f"unknown field type {kind!r}")
    if offset + size > len(data):
        raise Truncated("a value runs past the end of its table")
    return size


def _timestamp(raw: bytes, path: str, notes: list[str], *, keep_integer: bool = False) -> Any:
    """A timestamp as pamqp reads it (seconds, or milliseconds past 2106); out of range: None for the
    property, the integer for a header value, and a note either way."""
    try:
        return decode.timestamp(raw)[1]
    except (ValueError, OverflowError, OSError):
        seconds = _U64.unpack(raw[:8])[0]
        kept = " (kept as an integer)" if keep_integer else ""
        notes.append(_note(f"{path}: {seconds} is out of range{kept}"))
        return seconds if keep_integer else None


def _byte_at(data: bytes, offset: int) -> int:
    if offset >= len(data):
        raise Truncated("a length runs past the end of the content header")
    return data[offset]


def _u32_at(data: bytes, offset: int) -> int:
    if offset + 4 > len(data):
        raise Truncated("a length runs past the end of the content header")
    return int(_U32.unpack_from(data, offset)[0])


def _why(exc: BaseException) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return message_of(exc)


def printable(text: str, limit: int = _NOTE_LIMIT) -> str:
    """``text`` for a one-line note: what does not print replaced by U+FFFD, at most ``limit`` characters."""
    flat = "".join(ch if ch.isprintable() else "\ufffd" for ch in text)
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _note(text: str) -> str:
    return printable(text)


def as_notes(value: Any) -> list[str]:
    """A header that holds notes (:data:`UNDECODABLE`, ``x-ltm-dropped``) as a list of strings."""
    if not isinstance(value, list):
        return []
    return [n if isinstance(n, str) else str(n) for n in value]


def undecodable(headers: dict[str, Any] | None) -> list[str]:
    """What the decoder left out of a delivery's properties (empty when everything decoded)."""
    return as_notes((headers or {}).get(UNDECODABLE))
