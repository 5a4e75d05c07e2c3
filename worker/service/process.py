"""Events against Postgres: read their state, decide (a save's notice is rendered from its plan), then
write everything they write in one transaction (one statement): the claim of each event id, the count
under the scope lock, the memory row, the recorded outcome. One event is a batch of one; under load the
worker passes the events that are ready together (:mod:`worker.service.batcher`).

The read is its own statement: under READ COMMITTED a read inside the writing transaction would take
its own snapshot all the same, and what must be atomic (claim, limit, row, outcome) is. A write that
fails for any reason rolls back whole: no memory row, no recorded outcome, so the event can be
processed again for real (a retry or a dead-letter replay).

Every tool result the worker sends is built here, once, typed: an outcome that saves nothing before its
write (the ledger stores it as it is), a save's after its write has drawn the memory's id (the ledger's
copy goes with the write without the id, which the statement writes in), and a replay from the
ledger's copy. The answer that goes with a dead letter is the policy's decision's own
(:class:`worker.service.policy.DeadLetter` carries its outcome), built where the delivery is dead-lettered.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import asyncpg
import structlog

from contracts.models import Status, ToolCallEvent, ToolResult
from worker.pipeline import outcome
from worker.pipeline.limits import MemoryLimits, limit_reached, max_for
from worker.pipeline.notice import notice_for
from worker.pipeline.outcome import Outcome
from worker.pipeline.plan import SavePlan
from worker.pipeline.state import LoadedState
from worker.pipeline.steps import decide, missing_state, saved, users_needed
from worker.service.digest import event_digest, same_event
from worker.store import repository as repo

log = structlog.get_logger("worker")


@dataclass(frozen=True, slots=True)
class Conflict:
    """The event's ``event_id`` is in the ledger for a different event (its digest differs): the event is
    refused, nothing is written, and the stored outcome is not shown (:mod:`worker.service.digest`)."""

    #: the shard of the event the ledger row answers (for the operator's log line; never sent to a shard)
    stored_shard_id: int


@dataclass(frozen=True, slots=True)
class ProcessedEvent:
    """What to publish for an event, from this transaction or from the ledger (``replayed``).

    The result stays typed until the publisher serialises it; the notice and the invalidation are the JSON
    the ledger holds, as they are published (a replay re-emits them from the ledger as they are)."""

    status: Status
    memory_id: int | None
    result: ToolResult
    notification: dict[str, Any] | None
    invalidation: dict[str, Any] | None
    replayed: bool
    #: set when the event was refused as an ``event_id`` conflict (``result`` is the refusal)
    conflict: Conflict | None = None

    def as_replay(self) -> ProcessedEvent:
        """The same outputs re-emitted: identical but for ``replayed: true`` in the result."""
        return replace(self, result=self.result.model_copy(update={"replayed": True}), replayed=True)


def utcnow() -> datetime:
    return datetime.now(UTC)


async def process_event(
    pool: asyncpg.Pool,
    event: ToolCallEvent,
    limits: MemoryLimits,
    *,
    attempts: int = 1,
    clock: Callable[[], datetime] = utcnow,
) -> ProcessedEvent:
    """Process ``event`` exactly once; a second call for the same ``event_id`` returns the stored outputs."""
    [processed] = await process_batch(pool, [(event, attempts)], limits, clock=clock)
    return processed


async def process_batch(
    pool: asyncpg.Pool,
    jobs: Sequence[tuple[ToolCallEvent, int]],
    limits: MemoryLimits,
    *,
    clock: Callable[[], datetime] = utcnow,
) -> list[ProcessedEvent]:
    """Process each ``(event, attempts)`` exactly once, on one connection; the answers in job order.

    Two round trips for the whole batch: one read (each event's state, or its stored outcome if it was
    answered before), then one statement that writes everything the events write in a single transaction
    (claims, memory rows, outcomes). A scope found full costs a third (recording the limit outcomes),
    an event claimed by a concurrent delivery a fourth (its stored outcome). Any exception means nothing
    of the batch was written by this call (or, if the connection died at the commit, that it may have
    been: a retry is then answered from the ledger).
    """
    processed_at = clock()
    digests = [event_digest(event) for event, _ in jobs]
    answers: list[ProcessedEvent | None] = [None] * len(jobs)
    async with pool.acquire() as conn:
        loaded = await repo.load_many(conn, [(event, users_needed(event)) for event, _ in jobs])
        # what the batch writes, by job index; a save's plan, for its answer once the write has drawn its id
        writes: dict[int, repo.SaveItem | repo.RecordItem] = {}
        plans: dict[int, SavePlan] = {}
        for k, ((event, attempts), (stored, state)) in enumerate(zip(jobs, loaded, strict=True)):
            if stored is not None:
                answers[k] = _stored_answer(stored, event, digests[k], processed_at)
                continue
            decision = decide(event, state, limits)
            if isinstance(decision, SavePlan):
                plans[k] = decision
                writes[k] = _save(event, state, decision, limits, attempts, processed_at, digests[k])
            else:
                if decision.error == outcome.CRITICAL_STATE_MISSING:
                    _say_what_is_missing(event, state)
                # answered as it is, unless the write finds the event recorded already (a duplicate)
                answers[k], writes[k] = _record(event, decision, attempts, processed_at, digests[k])
        duplicates, full = await _write(conn, writes, plans, jobs, answers)
        limit_writes: dict[int, repo.SaveItem | repo.RecordItem] = {}
        for k, count in full.items():
            item = writes[k]
            answers[k], limit_writes[k] = _record(
                jobs[k][0], limit_reached(plans[k], count, limits), item.attempts, processed_at, item.digest
            )
        more, _ = await _write(conn, limit_writes, plans, jobs, answers)
        duplicates += more
        if duplicates:
            # another delivery of these events recorded their outcome first: answer with it
            stored_rows = await repo.load_outcomes(conn, [jobs[k][0].event_id for k in duplicates])
            for k in duplicates:
                row = stored_rows.get(jobs[k][0].event_id)
                # impossible: an event id is only committed with its outcome
                if row is None or row["result"] is None:
                    raise RuntimeError(f"event {jobs[k][0].event_id} is recorded but has no stored outcome")
                answers[k] = _stored_answer(row, jobs[k][0], digests[k], processed_at)
    assert all(a is not None for a in answers)
    return answers  # type: ignore[return-value]


def _say_what_is_missing(event: ToolCallEvent, state: LoadedState) -> None:
    """The WARNING behind an ``internal_error`` for missing bot rows: which ones (the model is told only the
    original's sentence). The ids are explicit: a batch may run under another event's bound context."""
    log.warning(
        "critical state missing",
        missing=missing_state(event, state),
        event_id=str(event.event_id),
        tool_call_id=event.tool_call_id,
        shard_id=event.shard_id,
    )


def _save(
    event: ToolCallEvent,
    state: LoadedState,
    plan: SavePlan,
    limits: MemoryLimits,
    attempts: int,
    processed_at: datetime,
    digest: bytes,
) -> repo.SaveItem:
    """Count and insert under the scope lock, so concurrent writers never exceed the limit."""
    return repo.SaveItem(
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
        result=saved(plan, memory_id=None).result(event, processed_at).model_dump(mode="json"),
        notice=notice_for(plan, event, state.users, limits.notice_preview_limit).model_dump(mode="json"),
        invalidation=plan.invalidation.model_dump(mode="json"),
        attempts=attempts,
        processed_at=processed_at,
        digest=digest,
    )


def _record(
    event: ToolCallEvent, final: Outcome, attempts: int, processed_at: datetime, digest: bytes | None
) -> tuple[ProcessedEvent, repo.RecordItem]:
    """Record an outcome that saved nothing (every failure status): its answer, known before the write, and
    the item that stores it as it is."""
    answer = final.result(event, processed_at)
    item = repo.RecordItem(
        event.event_id,
        event.tool_call_id,
        event.tool_name,
        event.shard_id,
        status=final.status,
        scope=final.scope,
        result=answer.model_dump(mode="json"),
        attempts=attempts,
        processed_at=processed_at,
        digest=digest,
    )
    return ProcessedEvent(answer.status, None, answer, None, None, replayed=False), item


async def _write(
    conn: asyncpg.Connection,
    writes: Mapping[int, repo.SaveItem | repo.RecordItem],
    plans: Mapping[int, SavePlan],
    jobs: Sequence[tuple[ToolCallEvent, int]],
    answers: list[ProcessedEvent | None],
) -> tuple[list[int], dict[int, int]]:
    """Apply ``writes`` (by job index) in one statement and answer each save that inserted its memory (a
    record's answer is already in ``answers``). Returns the indexes of the duplicates, and the saves that
    found their scope full with the count they found (their limit outcome is a second write)."""
    if not writes:
        return [], {}
    duplicates: list[int] = []
    full: dict[int, int] = {}
    for (k, item), done in zip(
        writes.items(), await repo.write_many(conn, list(writes.values())), strict=True
    ):
        if done.duplicate:
            duplicates.append(k)
        elif isinstance(item, repo.RecordItem):
            pass
        elif done.memory_id is None:
            assert done.current_count is not None
            full[k] = done.current_count
        else:
            answer = saved(plans[k], done.memory_id).result(jobs[k][0], item.processed_at)
            answers[k] = ProcessedEvent(
                Status.SAVED, done.memory_id, answer, item.notice, item.invalidation, replayed=False
            )
    return duplicates, full


def _stored_answer(
    stored: Mapping[str, Any], event: ToolCallEvent, digest: bytes, processed_at: datetime
) -> ProcessedEvent:
    """The answer to an event whose id the ledger holds: the stored outcome when it is this event's, else
    the refusal of a conflict (which names nothing of the stored event)."""
    if same_event(stored, event, digest):
        return _replay(stored)
    refusal = outcome.event_conflict().result(event, processed_at)
    return ProcessedEvent(
        refusal.status, None, refusal, None, None, replayed=False, conflict=Conflict(int(stored["shard_id"]))
    )


def _replay(stored: Mapping[str, Any]) -> ProcessedEvent:
    """A stored outcome re-emitted: identical to the first emission but for ``replayed: true``."""
    return ProcessedEvent(
        status=Status(stored["status"]),
        memory_id=stored["memory_id"],
        result=ToolResult.model_validate({**stored["result"], "replayed": True}),
        notification=stored["notice"],
        invalidation=stored["invalidation"],
        replayed=True,
    )
