"""One event, one Postgres transaction: claim the event id, load state, decide, count and insert under
the scope lock, record the outcome, commit.

A transaction that fails for any reason rolls back whole: no memory row, no recorded outcome, so the
event can be processed again for real (a retry or a dead-letter replay).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import asyncpg

from contracts.models import ToolCallEvent
from worker.config import Limits
from worker.pipeline.notice import mentioned_user_ids
from worker.pipeline.outcome import SERVER_WIDE, Outcome
from worker.pipeline.state import LoadedState
from worker.pipeline.steps import SavePlan, check_limit, decide, saved
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
    """Process ``event`` exactly once; a second call for the same ``event_id`` returns the stored outputs."""
    async with pool.acquire() as conn, conn.transaction():
        claimed = await repo.claim_event(
            conn, event.event_id, event.tool_call_id, event.tool_name, event.shard_id
        )
        if not claimed:
            return await _stored(conn, event)
        state = await _load_state(conn, event)
        decision = decide(event, state, limits)
        final = await _complete(conn, decision, limits) if isinstance(decision, SavePlan) else decision
        processed_at = clock()
        result = final.result(event, processed_at).model_dump(mode="json")
        notification = final.notification.model_dump(mode="json") if final.notification else None
        invalidation = final.invalidation.model_dump(mode="json") if final.invalidation else None
        await repo.record_outcome(
            conn,
            event.event_id,
            status=final.status,
            scope=final.scope,
            memory_id=final.memory_id,
            result=result,
            notice=notification,
            invalidation=invalidation,
            attempts=attempts,
            processed_at=processed_at,
        )
    return ProcessedEvent(final.status, final.memory_id, result, notification, invalidation, replayed=False)


async def _stored(conn: asyncpg.Connection, event: ToolCallEvent) -> ProcessedEvent:
    row = await repo.load_outcome(conn, event.event_id)
    if row is None or row["result"] is None:  # impossible: a claim is only ever committed with its outcome
        raise RuntimeError(f"event {event.event_id} is claimed but has no stored outcome")
    stored = ProcessedEvent(
        status=row["status"],
        memory_id=row["memory_id"],
        result=row["result"],
        notification=row["notice"],
        invalidation=row["invalidation"],
        replayed=False,
    )
    return stored.as_replay()


async def _load_state(conn: asyncpg.Connection, event: ToolCallEvent) -> LoadedState:
    ctx = event.context
    trigger = ctx.triggering_user_disc_id
    server_disc_id = ctx.guild_disc_id or trigger
    if server_disc_id is None:
        return LoadedState(server=None, persona=None)
    server, persona = await repo.load_server_and_persona(conn, server_disc_id, ctx.persona_id)
    ids = {m.user_disc_id for m in ctx.guild_members}
    ids.update(p.target_id for p in ctx.participants)
    if trigger:
        ids.add(trigger)
    if isinstance(event.arguments, dict) and isinstance(event.arguments.get("memory_content"), str):
        ids.update(mentioned_user_ids(event.arguments["memory_content"]))
    users = await repo.load_users(
        conn,
        ids,
        persona.lineage_id if persona else None,
        server.server_id if server else None,
    )
    return LoadedState(server=server, persona=persona, users=users)


async def _complete(conn: asyncpg.Connection, plan: SavePlan, limits: Limits) -> Outcome:
    """Count and insert under the scope lock, so concurrent writers never exceed the limit."""
    await repo.lock_scope(conn, plan.scope, plan.owner_id, plan.lineage_id)
    if plan.scope == SERVER_WIDE:
        count = await repo.count_server_memories(conn, plan.owner_id, plan.lineage_id)
    else:
        count = await repo.count_personal_memories(conn, plan.owner_id, plan.lineage_id)
    refused = check_limit(plan, count, limits)
    if refused is not None:
        return refused
    if plan.scope == SERVER_WIDE:
        memory_id = await repo.insert_server_memory(
            conn, plan.owner_id, plan.persona_id, plan.lineage_id, plan.author_user_id, plan.content
        )
    else:
        memory_id = await repo.insert_personal_memory(conn, plan.owner_id, plan.lineage_id, plan.content)
    return saved(plan, memory_id)
