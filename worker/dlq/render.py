"""What ``worker dlq`` prints: the list table and JSON lines, a dead letter in full, progress."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, TextIO

import orjson

from worker.broker.headers import rfc3339
from worker.dlq.letters import DeadLetter
from worker.dlq.sweep import Found, Sweep

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


def list_line(letter: DeadLetter, now: datetime) -> str:
    """One human-readable line (the error last, in full, on one line)."""
    return _row(
        (
            letter.event_id or "-",
            letter.kind,
            "-" if letter.attempts is None else str(letter.attempts),
            "-" if letter.failed_at is None else rfc3339(letter.failed_at),
            "-" if letter.shard_id is None else str(letter.shard_id),
            format_age(letter.age(now)),
            " ".join(letter.error.split()),
        )
    )


def _row(cells: Sequence[str]) -> str:
    padded = [cell.ljust(width) for cell, width in zip(cells, _WIDTHS, strict=False)]
    return "  ".join([*padded, *cells[len(_WIDTHS) :]]).rstrip()


def json_line(letter: DeadLetter) -> str:
    return orjson.dumps(letter.as_json()).decode()


_PROPERTIES = (
    "content_type",
    "content_encoding",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
)


def format_message(found: Found, now: datetime) -> str:
    """The whole message for ``worker dlq show``: summary, delivery, properties, headers, body."""
    message, letter = found.message, found.letter
    attempts = "?" if letter.attempts is None else letter.attempts
    failed_at = "?" if letter.failed_at is None else rfc3339(letter.failed_at)
    shard = "-" if letter.shard_id is None else letter.shard_id
    lines = [
        f"event {letter.event_id or '-'}: {letter.kind}, {attempts} attempt(s), failed at {failed_at}"
        f" ({format_age(letter.age(now))} ago), shard {shard}",
        f"error: {letter.error}",
        f"replays to: {letter.routing_key or '?'} (replayed {letter.replay_count} time(s) so far)",
        "delivery:",
        f"  exchange: {message.exchange!r}",
        f"  routing_key: {message.routing_key!r}",
        f"  redelivered: {str(bool(message.redelivered)).lower()}",
        "properties:",
    ]
    for name in _PROPERTIES:
        value = getattr(message, name, None)
        if value is not None:
            lines.append(f"  {name}: {_render(value)}")
    lines.append("headers:")
    for key, value in sorted((message.headers or {}).items()):
        lines.append(f"  {key}: {_render(value, indent=2)}")
    body = message.body
    try:
        parsed = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        lines.append(f"body (not JSON, {len(body)} bytes):")
        lines.append(repr(body))
    else:
        lines.append(f"body (JSON, {len(body)} bytes):")
        lines.append(json.dumps(parsed, indent=2, ensure_ascii=False))
    return "\n".join(lines)


def _render(value: Any, indent: int = 0) -> str:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    text = json.dumps(value, indent=2, ensure_ascii=False, default=_jsonable, sort_keys=True)
    return text.replace("\n", "\n" + " " * indent)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return rfc3339(value)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


class Progress:
    """``replay: 1200/3000 scanned, 1100 moved`` on stderr: rewritten in place on a terminal, one line
    per batch otherwise (only with --progress)."""

    def __init__(self, verb: str, stream: TextIO, *, live: bool) -> None:
        self._verb = verb
        self._stream = stream
        self._live = live
        self._last = 0.0
        self._width = 0

    def __call__(self, sweep: Sweep) -> None:
        text = f"{self._verb}: {sweep.scanned}/{sweep.expected} scanned, {sweep.removed} {_PAST[self._verb]}"
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


_PAST = {"replay": "moved", "purge": "deleted"}
