"""Step 1 of SPEC.md: read a delivery's body as a tool-call event, or say why it is a dead letter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

import orjson
from pydantic import ValidationError

from contracts.models import MAX_BODY_BYTES, DeadLetterKind, ToolCallEvent


@dataclass(frozen=True, slots=True)
class RoutableIds:
    """What a shard needs to be answered even when the rest of the envelope is broken."""

    event_id: UUID
    tool_call_id: str
    shard_id: int
    tool_name: str


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A body that is not a valid event: ``malformed`` or ``schema`` (CONTRACT.md "Dead letters")."""

    kind: DeadLetterKind
    error: str
    ids: RoutableIds | None = None


def read_event(body: bytes) -> ToolCallEvent | Unreadable:
    """Parse ``body`` with the contract models; never raises."""
    if len(body) > MAX_BODY_BYTES:
        return Unreadable(
            DeadLetterKind.SCHEMA, f"body of {len(body)} bytes is over the {MAX_BODY_BYTES} byte limit"
        )
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return Unreadable(DeadLetterKind.MALFORMED, f"not UTF-8 JSON: {_one_line(str(exc))}")
    if not isinstance(data, dict):
        return Unreadable(
            DeadLetterKind.MALFORMED,
            f"JSON {type(data).__name__ if data is not None else 'null'} is not an object",
        )
    try:
        return ToolCallEvent.model_validate(data)
    except ValidationError as exc:
        return Unreadable(DeadLetterKind.SCHEMA, _describe(exc), routable_ids(data))


def routable_ids(data: dict[str, Any]) -> RoutableIds | None:
    """``event_id``, ``tool_call_id`` and ``shard_id`` when all three can still be read."""
    raw_id, call_id, shard = data.get("event_id"), data.get("tool_call_id"), data.get("shard_id")
    if not isinstance(raw_id, str) or not isinstance(call_id, str):
        return None
    if not isinstance(shard, int) or isinstance(shard, bool) or shard < 0:
        return None
    try:
        event_id = UUID(raw_id)
    except ValueError:
        return None
    tool_name = data.get("tool_name")
    return RoutableIds(
        event_id, call_id, shard, tool_name if isinstance(tool_name, str) else "create_long_term_memory"
    )


def _describe(exc: ValidationError) -> str:
    """One line naming each broken field: ``envelope breaks the contract: shard_id: Input should be …``."""
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(str(p) for p in error["loc"]) or "body"
        parts.append(f"{where}: {error['msg']}")
    more = f" (+{exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
    return _one_line("envelope breaks the contract: " + "; ".join(parts) + more)


def _one_line(text: str, limit: int = 500) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
