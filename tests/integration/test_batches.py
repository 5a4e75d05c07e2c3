"""Events written together (process_batch, Batcher): the same answers and rows as one by one, the same
limits under concurrency, and a failure that stays with the event that caused it."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from contracts.models import Status, ToolCallEvent
from tests.factories import BotRows, World, event, member, published
from tests.support.outages import Gate
from worker.config import Limits
from worker.service.batcher import Batcher
from worker.service.process import ProcessedEvent, process_batch, process_event

pytestmark = pytest.mark.integration

SPARROW = "1150000000000000201"
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def clock() -> datetime:
    return NOW


def mixed_events(world: World) -> list[ToolCallEvent]:
    """Saves of both scopes, and failures of several stages (arguments, critical state, resolver)."""
    sparrow = [member(SPARROW, "sparrow_ow", "Sparrow")]
    return [
        event(
            {"memory_content": "{user} likes dogs", "memory_scope": "server_wide"},
            persona_id=world.persona_id,
        ),
        event(
            {"memory_content": "likes cats", "memory_scope": "target_user", "target_user": "Sparrow"},
            persona_id=world.persona_id,
            members=sparrow,
        ),
        event({"memory_content": "", "memory_scope": "server_wide"}, persona_id=world.persona_id),
        event({"memory_content": "x", "memory_scope": "banana"}, persona_id=world.persona_id),
        event({"memory_content": "fact", "memory_scope": "server_wide"}, persona_id=world.persona_id + 100),
        event(
            {"memory_content": "likes owls", "memory_scope": "target_user", "target_user": "Nobody"},
            persona_id=world.persona_id,
            members=sparrow,
        ),
        event({"memory_content": "second fact", "memory_scope": "server_wide"}, persona_id=world.persona_id),
    ]


def comparable(done: ProcessedEvent) -> dict[str, Any]:
    """An answer without what differs between two runs of the same event (ids)."""
    result = {k: v for k, v in published(done.result).items() if k not in ("event_id", "tool_call_id")}
    result["data"] = {k: v for k, v in result["data"].items() if k != "memory_id"}
    notice = {k: v for k, v in (done.notification or {}).items() if k != "event_id"}
    return {"status": done.status, "result": result, "notice": notice, "saved": done.memory_id is not None}


def again(ev: ToolCallEvent) -> ToolCallEvent:
    """The same event under a new id (the bot publishing it a second time)."""
    return event(ev.arguments, **_kwargs(ev))


def _kwargs(ev: ToolCallEvent) -> dict[str, Any]:
    ctx = ev.context
    return {
        "persona_id": ctx.persona_id,
        "members": [dataclasses.asdict(m) for m in ctx.guild_members],
    }


async def test_a_batch_answers_each_event_as_it_would_alone(pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world()
    await rows.user(SPARROW)
    events = mixed_events(world)

    alone = [await process_event(pool, ev, Limits(), clock=clock) for ev in events]
    together = await process_batch(pool, [(again(ev), 1) for ev in events], Limits(), clock=clock)

    assert [comparable(d) for d in together] == [comparable(d) for d in alone]
    statuses = Counter(d.status for d in together)
    assert statuses[Status.SAVED] == 3
    assert await rows.conn.fetchval("SELECT count(*) FROM server_memories") == 4
    assert await rows.conn.fetchval("SELECT count(*) FROM personal_memories") == 2
    assert await rows.conn.fetchval("SELECT count(*) FROM ltm_processed_events") == 2 * len(events)
    # each saved answer names its own new row
    ids = [d.memory_id for d in together if d.memory_id is not None]
    assert len(set(ids)) == len(ids) == 3
    for done in together:
        if done.memory_id is not None:
            assert published(done.result)["data"]["memory_id"] == done.memory_id


async def test_a_batch_fills_a_scope_in_order_and_stops_at_the_limit(
    pool: asyncpg.Pool, rows: BotRows
) -> None:
    world = await rows.world()
    limits = Limits(max_server_memories=5)
    await rows.server_memories(world.server_id, world.lineage_id, 2)
    events = [
        event({"memory_content": f"fact {i}", "memory_scope": "server_wide"}, persona_id=world.persona_id)
        for i in range(8)
    ]

    done = await process_batch(pool, [(ev, 1) for ev in events], limits)

    statuses = Counter(d.status for d in done)
    assert statuses == {Status.SAVED: 3, Status.LIMIT_EXCEEDED: 5}
    full = [d for d in done if d.status == Status.LIMIT_EXCEEDED]
    assert all(published(d.result)["data"]["current_count"] == 5 for d in full)
    assert await rows.conn.fetchval("SELECT count(*) FROM server_memories") == 5
    assert await rows.conn.fetchval("SELECT count(*) FROM ltm_processed_events") == 8


async def test_concurrent_batches_take_the_last_slots_exactly(pool: asyncpg.Pool, rows: BotRows) -> None:
    """Batches on 10 connections racing for 3 slots of one scope and 3 of another: no deadlock, exact."""
    world = await rows.world()
    target = await rows.user(SPARROW)
    limits = Limits(max_server_memories=10, max_personal_memories=10)
    await rows.server_memories(world.server_id, world.lineage_id, 7)
    await rows.personal_memories(target, world.lineage_id, 7)
    sparrow = [member(SPARROW, "sparrow_ow", "Sparrow")]
    events = [
        event({"memory_content": f"fact {i}", "memory_scope": "server_wide"}, persona_id=world.persona_id)
        if i % 2
        else event(
            {"memory_content": f"fact {i}", "memory_scope": "target_user", "target_user": "Sparrow"},
            persona_id=world.persona_id,
            members=sparrow,
        )
        for i in range(80)
    ]
    # batches of 8, personal and server-wide mixed in each, so every batch locks both scopes
    batches = [events[k : k + 8] for k in range(0, len(events), 8)]

    answers = await asyncio.gather(*(process_batch(pool, [(ev, 1) for ev in b], limits) for b in batches))

    statuses = Counter(d.status for batch in answers for d in batch)
    assert statuses == {Status.SAVED: 6, Status.LIMIT_EXCEEDED: 74}
    assert await rows.conn.fetchval("SELECT count(*) FROM server_memories") == 10
    assert await rows.conn.fetchval("SELECT count(*) FROM personal_memories") == 10


async def test_the_same_event_twice_in_one_batch_is_written_once(pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world()
    ev = event({"memory_content": "fact", "memory_scope": "server_wide"}, persona_id=world.persona_id)
    failing = event({"memory_content": "", "memory_scope": "server_wide"}, persona_id=world.persona_id)

    done = await process_batch(pool, [(ev, 1), (failing, 1), (ev, 2), (failing, 1)], Limits())

    assert [d.replayed for d in done] == [False, False, True, True]
    assert published(done[2].result) == {**published(done[0].result), "replayed": True}
    assert published(done[3].result) == {**published(done[1].result), "replayed": True}
    assert await rows.conn.fetchval("SELECT count(*) FROM server_memories") == 1
    assert await rows.conn.fetchval("SELECT count(*) FROM ltm_processed_events") == 2


async def test_batcher_isolates_the_event_that_breaks(pool: asyncpg.Pool, rows: BotRows) -> None:
    """One event whose write fails (a trigger) fails alone; the rest of its batch is answered and saved."""
    world = await rows.world()
    await rows.conn.execute(
        """
        CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.content = 'poison' THEN RAISE EXCEPTION 'poison refused'; END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_poison BEFORE INSERT ON server_memories
            FOR EACH ROW EXECUTE FUNCTION refuse_poison();
        """
    )
    batches: list[int] = []
    batcher = Batcher(pool, Limits(), max_running=1, max_batch=16, on_batch=batches.append)
    contents = [f"fact {i}" for i in range(10)]
    contents[4] = "poison"
    events = [
        event({"memory_content": c, "memory_scope": "server_wide"}, persona_id=world.persona_id)
        for c in contents
    ]

    got = await asyncio.gather(*(batcher.process(ev) for ev in events), return_exceptions=True)
    assert batcher.running == 0

    assert isinstance(got[4], asyncpg.RaiseError)
    assert all(
        isinstance(g, ProcessedEvent) and g.status == Status.SAVED for i, g in enumerate(got) if i != 4
    )
    assert await rows.conn.fetchval("SELECT count(*) FROM server_memories") == 9
    assert await rows.conn.fetchval("SELECT count(*) FROM ltm_processed_events") == 9
    # the first event went alone (nothing was running); the other nine waited and went together
    assert batches[:2] == [1, 9]


async def test_batcher_runs_at_most_max_running_batches(pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world()
    batches: list[int] = []
    batcher = Batcher(pool, Limits(), max_running=2, max_batch=5, on_batch=batches.append)
    events = [
        event({"memory_content": f"fact {i}", "memory_scope": "server_wide"}, persona_id=world.persona_id)
        for i in range(22)
    ]

    got = await asyncio.gather(*(batcher.process(ev) for ev in events))
    assert batcher.running == 0

    assert all(g.status == Status.SAVED for g in got)
    assert sum(batches) == 22
    assert max(batches) == 5
    # the first starts at once, alone; while it runs the next ones wait until half a batch is ready
    # for the second connection, and from then on each batch leaves full
    assert batches[:2] == [1, 2]
    assert await rows.conn.fetchval("SELECT count(*) FROM server_memories") == 22


async def test_batcher_takes_another_connection_when_a_batch_is_slow(
    pool: asyncpg.Pool, rows: BotRows
) -> None:
    """A batch stuck at Postgres (here at a gate) holds the events behind it for max_wait, not forever."""
    world = await rows.world()
    gate = Gate(rows.conn, "server_memories")
    await gate.close()
    batches: list[int] = []
    batcher = Batcher(pool, Limits(), max_running=2, max_batch=32, max_wait=0.05, on_batch=batches.append)
    events = [
        event({"memory_content": f"fact {i}", "memory_scope": "server_wide"}, persona_id=world.persona_id)
        for i in range(3)
    ]
    first = asyncio.create_task(batcher.process(events[0]))
    await gate.wait_for_waiters(1)
    rest = [asyncio.create_task(batcher.process(ev)) for ev in events[1:]]

    # far from half a batch (16) waiting, but after 50 ms the two waiting events go on the second connection
    await gate.wait_for_waiters(2, timeout=5)
    assert batches == [1, 2]
    await gate.open()
    done = await asyncio.gather(first, *rest)

    assert [d.status for d in done] == [Status.SAVED] * 3
    assert batcher.running == 0
