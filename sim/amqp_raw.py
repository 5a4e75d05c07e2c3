"""Content headers byte by byte, for the tests and the bench that publish what no client library would
encode: out-of-range timestamps, keys and strings that are not UTF-8, unknown field types, tables nested
thousands deep.

:class:`RawProperties` goes where aiormq takes a ``Basic.Properties``: its ``marshal`` returns the bytes
given.
"""

from __future__ import annotations

import struct

from pamqp.commands import Basic

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


class RawProperties(Basic.Properties):
    """Properties whose encoding is given: the flags and fields exactly as they go on the wire."""

    def __init__(self, raw: bytes) -> None:
        super().__init__()
        self.raw = raw

    def marshal(self) -> bytes:
        return self.raw


def shortstr(value: bytes) -> bytes:
    assert len(value) < 256
    return bytes([len(value)]) + value


def longstr(value: bytes) -> bytes:
    return b"S" + _U32.pack(len(value)) + value


def timestamp(seconds: int) -> bytes:
    return b"T" + _U64.pack(seconds)


def long_long(value: int) -> bytes:
    return b"l" + struct.pack(">q", value)


def nested(payload: bytes) -> bytes:
    """A field table value whose payload (its entries, encoded) is given."""
    return b"F" + _U32.pack(len(payload)) + payload


def array(items: list[bytes]) -> bytes:
    payload = b"".join(items)
    return b"A" + _U32.pack(len(payload)) + payload


def entries(pairs: list[tuple[bytes, bytes]]) -> bytes:
    """A table's payload: each key as a short string, then its typed value."""
    return b"".join(shortstr(key) + value for key, value in pairs)


def deep_table(depth: int) -> bytes:
    """A table payload ``{"d": {"d": ... {}}}`` nested ``depth`` levels."""
    payload = b""
    for _ in range(depth):
        payload = shortstr(b"d") + nested(payload)
    return payload


def properties(
    *,
    content_type: bytes | None = b"application/json",
    headers: bytes | None = None,
    delivery_mode: int | None = 2,
    message_id: bytes | None = None,
    timestamp_seconds: int | None = None,
    message_type: bytes | None = None,
) -> RawProperties:
    """Basic.Properties encoded by hand; ``headers`` is a table's payload (its entries)."""
    fields: dict[str, bytes] = {}
    if content_type is not None:
        fields["content_type"] = shortstr(content_type)
    if headers is not None:
        fields["headers"] = _U32.pack(len(headers)) + headers
    if delivery_mode is not None:
        fields["delivery_mode"] = bytes([delivery_mode])
    if message_id is not None:
        fields["message_id"] = shortstr(message_id)
    if timestamp_seconds is not None:
        fields["timestamp"] = _U64.pack(timestamp_seconds)
    if message_type is not None:
        fields["message_type"] = shortstr(message_type)
    flags = 0
    parts: list[bytes] = []
    for name in Basic.Properties.__slots__:
        if name in fields:
            flags |= Basic.Properties.flags[name]
            parts.append(fields[name])
    return RawProperties(struct.pack(">H", flags) + b"".join(parts))
