"""Limits and idempotency under concurrent transactions (real Postgres, real races)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import asyncpg
import pytest

from contracts.models import Status
from tests.factories import BotRows, event, member, published
from worker.config import Limits
from worker.service.process import process_event
from worker.store.pool import create_pool

pytestmark = pytest.mark.integration

RACERS = 50
SPARROW = "1150000000000000201"


@pytest.fixture
async def wide_pool(migrated_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    """One connection per racer, so all 50 transactions are open at the same time."""
    pool = await create_pool(migrated_dsn, size=RACERS)
    try:
        yield pool
    finally:
        await pool.close()


async def race(pool: asyncpg.Pool, events: list, limits: Limits) -> Counter[str]:  # type: ignore[type-arg]
    start = asyncio.Event()

    async def one(ev):  # type: ignore[no-untyped-def]
        await start.wait()
        return await process_event(pool, ev, limits)

    tasks = [asyncio.create_task(one(ev)) for ev in events]
    await asyncio.sleep(0.05)
    start.set()
    return Counter(done.status for done in await asyncio.gather(*tasks))


async def test_last_server_slot_is_taken_exactly_once(wide_pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world()
    limits = Limits(max_server_memories=10)
    await rows.server_memories(world.server_id, world.lineage_id, limits.max_server_memories - 1)
    events = [
        event({"memory_content": f"fact {i}", "memory_scope": "server_wide"}, persona_id=world.persona_id)
        for i in range(RACERS)
    ]

    statuses = await race(wide_pool, events, limits)

    assert statuses == {Status.SAVED: 1, Status.LIMIT_EXCEEDED: RACERS - 1}
    count = await rows.conn.fetchval(
        "SELECT count(*) FROM server_memories WHERE server_id = $1 AND persona_lineage_id = $2",
        world.server_id,
        world.lineage_id,
    )
    assert count == limits.max_server_memories


async def test_last_personal_slot_is_taken_exactly_once_counting_lineage_zero(
    wide_pool: asyncpg.Pool, rows: BotRows
) -> None:
    world = await rows.world()
    target = await rows.user(SPARROW)
    limits = Limits(max_personal_memories=10)
    await rows.personal_memories(target, 0, 4)  # global memories count toward every persona's limit
    await rows.personal_memories(target, world.lineage_id, limits.max_personal_memories - 5)
    events = [
        event(
            {"memory_content": f"fact {i}", "memory_scope": "target_user", "target_user": "sparrow"},
            persona_id=world.persona_id,
            members=[member(SPARROW, "sparrow")],
        )
        for i in range(RACERS)
    ]

    statuses = await race(wide_pool, events, limits)

    assert statuses == {Status.SAVED: 1, Status.LIMIT_EXCEEDED: RACERS - 1}
    count = await rows.conn.fetchval(
        "SELECT count(*) FROM personal_memories WHERE user_id = $1 AND persona_lineage_id IN (0, $2)",
        target,
        world.lineage_id,
    )
    assert count == limits.max_personal_memories


async def test_same_event_twice_in_sequence_writes_one_row(wide_pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world()
    ev = event(
        {"memory_content": "{user} likes dogs", "memory_scope": "server_wide"}, persona_id=world.persona_id
    )

    first = await process_event(wide_pool, ev, Limits())
    second = await process_event(wide_pool, ev, Limits())

    assert first.replayed is False
    assert second.replayed is True
    assert published(second.result) == {**published(first.result), "replayed": True}
    assert second.notification == first.notification
    assert second.invalidation == first.invalidation
    assert await rows.conn.fetchval("SELECT count(*) FROM server_memories") == 1


async def test_failure_outcomes_are_replayed_too(wide_pool: asyncpg.Pool, rows: BotRows) -> None:
    ev = event({"memory_content": "x"}, persona_id=1)
    first = await process_event(wide_pool, ev, Limits())
    second = await process_event(wide_pool, ev, Limits())
    assert published(second.result) == {**published(first.result), "replayed": True}


async def test_same_event_concurrently_writes_one_row(wide_pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world()
    ev = event(
        {"memory_content": "{user} likes dogs", "memory_scope": "server_wide"}, persona_id=world.persona_id
    )

    start = asyncio.Event()

    async def deliver():  # type: ignore[no-untyped-def]
        await start.wait()
        return await process_event(wide_pool, ev, Limits())

    tasks = [asyncio.create_task(deliver()) for _ in range(20)]
    await asyncio.sleep(0.05)
    start.set()
    results = await asyncio.gather(*tasks)

    originals = [r for r in results if not r.replayed]
    assert len(originals) == 1
    for replay in results:
        assert {**published(replay.result), "replayed": False} == published(originals[0].result)
    assert await rows.conn.fetchval("SELECT count(*) FROM server_memories") == 1
    assert await rows.conn.fetchval("SELECT count(*) FROM ltm_processed_events") == 1


async def test_a_rolled_back_event_leaves_nothing_behind(wide_pool: asyncpg.Pool, rows: BotRows) -> None:
    """A transaction that dies after inserting the row records nothing: the next try saves for real."""
    world = await rows.world()
    ev = event({"memory_content": "fact", "memory_scope": "server_wide"}, persona_id=world.persona_id)
    # make the outcome write fail after the memory insert, inside the same transaction
    await rows.conn.execute(
        "ALTER TABLE ltm_processed_events"
        " ADD CONSTRAINT fail_on_save CHECK (status <> 'memory_saved_successfully')"
    )
    with pytest.raises(asyncpg.CheckViolationError):
        await process_event(wide_pool, ev, Limits())
    assert await rows.conn.fetchval("SELECT count(*) FROM server_memories") == 0
    assert await rows.conn.fetchval("SELECT count(*) FROM ltm_processed_events") == 0

    await rows.conn.execute("ALTER TABLE ltm_processed_events DROP CONSTRAINT fail_on_save")
    done = await process_event(wide_pool, ev, Limits())
    assert published(done.result)["success"] is True
    assert done.replayed is False
    assert await rows.conn.fetchval("SELECT count(*) FROM server_memories") == 1
