"""One event against Postgres: read its state, decide, then write everything it writes in one
transaction (one statement): the claim of the event id, the count under the scope lock, the memory
row, the recorded outcome.

The read is its own statement: under READ COMMITTED a read inside the writing transaction would take
its own snapshot all the same, and what must be atomic (claim, limit, row, outcome) is. A write that
fails for any reason rolls back whole: no memory row, no recorded outcome, so the event can be
processed again for real (a retry or a dead-letter replay).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import asyncpg

from contracts.models import ToolCallEvent
from worker.config import Limits
from worker.pipeline.notice import mentioned_user_ids
from worker.pipeline.outcome import Outcome
from worker.pipeline.steps import SavePlan, decide, limit_reached, max_for, saved
from worker.store import repository as repo


@dataclass(frozen=True, slots=True)
class ProcessedEvent:
    """What to publish for an event, from this transaction or from the ledger (``replayed``)."""

    status: str
    memory_id: int | None
    result: dict[str, Any]
    notification: dict[str, Any] | None
    invalidation: dict[str, Any] | None
    replayed: bool

    def as_replay(self) -> ProcessedEvent:
        """The same outputs re-emitted: identical but for ``replayed: true`` in the result."""
        return replace(self, result={**self.result, "replayed": True}, replayed=True)


def utcnow() -> datetime:
    return datetime.now(UTC)


async def process_event(
    pool: asyncpg.Pool,
    event: ToolCallEvent,
    limits: Limits,
    *,
    attempts: int = 1,
    clock: Callable[[], datetime] = utcnow,
) -> ProcessedEvent:
    """Process ``event`` exactly once; a second call for the same ``event_id`` returns the stored outputs.

    Two round trips: one read (state, or the stored outcome of a redelivery), then one statement that
    writes everything the event writes in a single transaction (claim, memory row, outcome) or nothing.
    A scope found full costs a third (recording the limit outcome).
    """
    ctx = event.context
    async with pool.acquire() as conn:
        loaded = await repo.load(
            conn,
            event.event_id,
            ctx.guild_disc_id or ctx.triggering_user_disc_id,
            ctx.persona_id,
            _user_ids(event),
        )
        if loaded.stored is not None:
            return _replay(loaded.stored)
        decision = decide(event, loaded.state, limits)
        processed_at = clock()
        if isinstance(decision, SavePlan):
            return await _save(conn, event, decision, limits, attempts, processed_at)
        return await _record(conn, event, decision, attempts, processed_at)


def _user_ids(event: ToolCallEvent) -> set[str]:
    """Every Discord id the pipeline may look up: the trigger and the users mentioned in the content, and
    for a ``target_user`` save the guild members and participants the resolver may pick from."""
    ctx = event.context
    arguments = event.arguments if isinstance(event.arguments, dict) else {}
    ids: set[str] = set()
    if arguments.get("memory_scope") == "target_user":
        ids.update(m.user_disc_id for m in ctx.guild_members)
        ids.update(p.target_id for p in ctx.participants)
    if ctx.triggering_user_disc_id:
        ids.add(ctx.triggering_user_disc_id)
    content = arguments.get("memory_content")
    if isinstance(content, str):
        ids.update(mentioned_user_ids(content))
    return ids


async def _save(
    conn: asyncpg.Connection,
    event: ToolCallEvent,
    plan: SavePlan,
    limits: Limits,
    attempts: int,
    processed_at: datetime,
) -> ProcessedEvent:
    """Count and insert under the scope lock, so concurrent writers never exceed the limit."""
    success = saved(plan, memory_id=0)  # the id is filled in by the database
    result = success.result(event, processed_at).model_dump(mode="json")
    notification = plan.notification.model_dump(mode="json")
    invalidation = plan.invalidation.model_dump(mode="json")
    duplicate, memory_id, count = await repo.save_event(
        conn,
        event.event_id,
        event.tool_call_id,
        event.tool_name,
        event.shard_id,
        scope=plan.scope,
        owner_id=plan.owner_id,
        lineage_id=plan.lineage_id,
        persona_id=plan.persona_id,
        author_id=plan.author_user_id,
        content=plan.content,
        max_allowed=max_for(plan, limits),
        result=result,
        notice=notification,
        invalidation=invalidation,
        attempts=attempts,
        processed_at=processed_at,
    )
    if duplicate:
        return await _stored(conn, event)
    if memory_id is None:
        assert count is not None
        return await _record(conn, event, limit_reached(plan, count, limits), attempts, processed_at)
    result["data"]["memory_id"] = memory_id
    return ProcessedEvent(success.status, memory_id, result, notification, invalidation, replayed=False)


async def _record(
    conn: asyncpg.Connection, event: ToolCallEvent, final: Outcome, attempts: int, processed_at: datetime
) -> ProcessedEvent:
    """Record an outcome that saved nothing (every failure status)."""
    result = final.result(event, processed_at).model_dump(mode="json")
    recorded = await repo.record_outcome(
        conn,
        event.event_id,
        event.tool_call_id,
        event.tool_name,
        event.shard_id,
        status=final.status,
        scope=final.scope,
        result=result,
        attempts=attempts,
        processed_at=processed_at,
    )
    if not recorded:  # another delivery of this event recorded its outcome first
        return await _stored(conn, event)
    return ProcessedEvent(final.status, None, result, None, None, replayed=False)


async def _stored(conn: asyncpg.Connection, event: ToolCallEvent) -> ProcessedEvent:
    """The outcome another delivery of this event recorded (it won the race for the event id)."""
    row = await repo.load_outcome(conn, event.event_id)
    if row is None or row["result"] is None:  # impossible: an event id is only committed with its outcome
        raise RuntimeError(f"event {event.event_id} is recorded but has no stored outcome")
    return _replay(dict(row))


def _replay(stored: Mapping[str, Any]) -> ProcessedEvent:
    """A stored outcome re-emitted: identical to the first emission but for ``replayed: true``."""
    return ProcessedEvent(
        status=stored["status"],
        memory_id=stored["memory_id"],
        result=stored["result"],
        notification=stored["notice"],
        invalidation=stored["invalidation"],
        replayed=False,
    ).as_replay()
