"""What ``worker dlq`` prints: the list table and JSON lines, a dead letter in full, progress.

A dead letter's body, properties and headers are the shard's text (the worker's own headers too, on a message
the broker dead-lettered): everything from them is printed through :func:`terminal_safe`, so an escape
sequence, a carriage return or a line feed shows as ``\\x1b``, ``\\r``, ``\\n`` instead of acting on the
operator's terminal (clearing it, or faking a line of output). ``--json`` lines are JSON-escaped instead.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, TextIO

import orjson

from worker.broker.dead_letters import Letter
from worker.broker.headers import rfc3339
from worker.ops.dlq.kinds import replay_note
from worker.ops.dlq.reading import DELIVERY_COUNT, DELIVERY_COUNT_MEANS, Seen
from worker.ops.dlq.sweep import Sweep

#: what a terminal acts on rather than shows: C0 controls (ESC, CR, LF, BS...), DEL, C1 controls (the 8-bit
#: CSI), and the Unicode format characters that hide or reorder text (zero-width, bidi embeddings, isolates)
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def terminal_safe(text: str) -> str:
    """``text`` with every character a terminal would act on written as an escape (``\\x1b``, ``\\u202e``)."""
    return _UNSAFE.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


#: a JSON body nested deeper than this is shown as received, not indented (a real event is 3 deep; 10,000
#: levels indented would be 100 MB of blanks, and Python's JSON parser recurses)
MAX_PRETTY_DEPTH = 64


def json_depth(body: bytes) -> int:
    """How deeply the arrays and objects of a JSON text nest (brackets outside strings), without parsing."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


_COLUMNS = ("EVENT_ID", "KIND", "ATTEMPTS", "FAILED_AT", "SHARD", "AGE", "ERROR")
_WIDTHS = (36, 19, 8, 24, 5, 7)


def format_age(age: timedelta | None) -> str:
    """``45s``, ``12m``, ``3h12m``, ``2d4h``; ``-`` when unknown."""
    if age is None:
        return "-"
    seconds = max(0, int(age.total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if hours == 0:
        return f"{minutes}m"
    if days == 0:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"


def list_header() -> str:
    return _row(_COLUMNS)


def list_line(letter: Letter, now: datetime) -> str:
    """One human-readable line (the error last, in full, on one line)."""
    return _row(
        (
            terminal_safe(letter.event_id or "-"),
            terminal_safe(letter.kind),
            "-" if letter.attempts is None else str(letter.attempts),
            "-" if letter.failed_at is None else rfc3339(letter.failed_at),
            "-" if letter.shard_id is None else str(letter.shard_id),
            format_age(letter.age(now)),
            terminal_safe(" ".join(letter.error.split())),
        )
    )


def _row(cells: Sequence[str]) -> str:
    padded = [cell.ljust(width) for cell, width in zip(cells, _WIDTHS, strict=False)]
    return "  ".join([*padded, *cells[len(_WIDTHS) :]]).rstrip()


def json_line(letter: Letter) -> str:
    return orjson.dumps(letter.as_json()).decode()


def format_message(seen: Seen, now: datetime) -> str:
    """The whole dead letter for ``worker dlq show``: summary, what to do, delivery, properties, headers,
    body; every piece of the message's own text made :func:`terminal_safe`. A kept letter says its state
    where one read from the queue says how often the DLQ was read (the table reads nothing from it)."""
    letter = seen.letter
    attempts = "?" if letter.attempts is None else letter.attempts
    failed_at = "?" if letter.failed_at is None else rfc3339(letter.failed_at)
    shard = "-" if letter.shard_id is None else letter.shard_id
    safe = terminal_safe
    lines = [
        f"event {safe(letter.event_id or '-')}: {safe(letter.kind)}, {attempts} attempt(s), failed at "
        f"{failed_at} ({format_age(letter.age(now))} ago), shard {shard}",
        f"error: {safe(letter.error)}",
        *([f"first attempt's error: {safe(letter.first_error)}"] if letter.first_error else []),
        f"what to do: {safe(replay_note(letter.kind, letter.errors))}",
        f"replays to: {safe(letter.replay_key or '?')} (replayed {letter.replay_count} time(s) so far)",
    ]
    lines.append(f"published by: {safe(letter.published_by.describe())}")
    lines += [
        f"state: {seen.state}" if seen.state is not None else f"read from the DLQ: {read_count(seen)}",
        "delivery:",
        f"  exchange: {safe(repr(seen.exchange))}",
        f"  routing_key: {safe(repr(seen.routing_key))}",
        f"  redelivered: {str(seen.redelivered).lower()}"
        + (" (read from the DLQ before, not a processing attempt)" if seen.redelivered else ""),
        "properties:",
    ]
    for name, value in seen.properties:
        lines.append(f"  {name}: {_render(value)}")
    lines.append("headers:")
    for key, value in sorted(seen.headers.items()):
        shown = _render(value, indent=2)
        if key == DELIVERY_COUNT:
            shown += " (times read from the DLQ)"
        lines.append(f"  {safe(str(key))}: {shown}")
    lines.extend(body_lines(seen.body, seen.body_size))
    return "\n".join(lines)


def read_count(seen: Seen) -> str:
    """``x-delivery-count`` in words: how often the letter was read from the DLQ before this read."""
    times = seen.times_read
    return f"{0 if times is None else times} time(s) before this one ({DELIVERY_COUNT_MEANS})"


def body_lines(body: bytes, size: int | None = None) -> list[str]:
    """The body: indented JSON, or as received when it is not JSON, nests too deep to indent, or only its
    first bytes were kept (``size``: the whole body's length)."""
    if size is not None and size > len(body):
        return [
            f"body ({size} bytes; the first {len(body)} shown, as received):",
            terminal_safe(body.decode(errors="replace")),
        ]
    depth = json_depth(body)
    if depth > MAX_PRETTY_DEPTH:
        text = body.decode(errors="replace")
        return [
            f"body ({len(body)} bytes, nested {depth} levels deep: shown as received, not indented):",
            terminal_safe(text),
        ]
    try:
        parsed = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return [f"body (not JSON, {len(body)} bytes):", repr(body)]
    pretty = json.dumps(parsed, indent=2, ensure_ascii=False)
    return [f"body (JSON, {len(body)} bytes):", *(terminal_safe(line) for line in pretty.split("\n"))]


def _render(value: Any, indent: int = 0) -> str:
    """A property or header value on the operator's terminal (nested ones as indented JSON)."""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return terminal_safe(str(value))
    try:
        text = json.dumps(value, indent=2, ensure_ascii=False, default=_jsonable, sort_keys=True)
    except (RecursionError, ValueError, TypeError):  # nested past the recursion limit, or keys of mixed types
        return terminal_safe(f"<{type(value).__name__} too deep or irregular to show>")
    return "\n".join(terminal_safe(line) for line in text.split("\n")).replace("\n", "\n" + " " * indent)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return rfc3339(value)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


class Progress:
    """``replay: 1200/3000 scanned, 1100 moved (50/s, 38 s left at most)`` on stderr: rewritten in place on a
    terminal, one line per batch otherwise (only with --progress; a paced replay at most one a second)."""

    def __init__(self, verb: str, stream: TextIO, *, live: bool, rate: float | None = None) -> None:
        self._verb = verb
        self._stream = stream
        self._live = live
        self._rate = rate
        self._last = 0.0
        self._width = 0

    def __call__(self, sweep: Sweep[Any]) -> None:
        text = f"{self._verb}: {sweep.scanned}/{sweep.expected} scanned, {sweep.removed} {_PAST[self._verb]}"
        if self._rate is not None:
            left = max(0, sweep.expected - sweep.scanned) / self._rate
            text += f" ({self._rate:g}/s, {left:.0f} s left at most)"
            now = time.monotonic()
            if not self._live and now - self._last < 1.0 and sweep.scanned < sweep.expected:
                return  # a line a second, not one a round
            if not self._live:
                self._last = now
        if self._live:
            now = time.monotonic()
            if now - self._last < 0.1 and sweep.scanned < sweep.expected:
                return
            self._last = now
            self._width = max(self._width, len(text))
            self._stream.write("\r" + text.ljust(self._width))
        else:
            self._stream.write(text + "\n")
        self._stream.flush()

    def finish(self) -> None:
        if self._live and self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()


_PAST = {"replay": "moved", "purge": "deleted", "expire": "expired"}
