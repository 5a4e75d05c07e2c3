"""The invalidation outbox against real Postgres and Redis: published at once while Redis answers, kept in
the ledger while it does not, published once when it is back, and a shared backlog published once by
several workers."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from urllib.parse import urlsplit

import asyncpg
import orjson
import pytest
import redis.asyncio as aioredis

from contracts.models import invalidation_id
from tests.support.proxy import CuttableProxy
from worker.invalidation.outbox import InvalidationOutbox
from worker.invalidation.redis import InvalidationPublisher
from worker.store.pool import create_pool

pytestmark = pytest.mark.integration

PENDING = "SELECT count(*) FROM ltm_processed_events WHERE invalidation_pending_since IS NOT NULL"


class Subscriber:
    def __init__(self, url: str, channel: str) -> None:
        self.client = aioredis.Redis.from_url(url)
        self.pubsub = self.client.pubsub()
        self.channel = channel
        self.seen: Counter[str] = Counter()

    async def __aenter__(self) -> Subscriber:
        await self.pubsub.subscribe(self.channel)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.pubsub.aclose()
        await self.client.aclose()

    async def collect(self, want: set[str], timeout: float = 10.0) -> None:
        """Read until every id in ``want`` arrived, then a short quiet time to catch duplicates."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        quiet_until: float | None = None
        while True:
            message = await self.pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
            if message is not None:
                self.seen[orjson.loads(message["data"])["invalidation_id"]] += 1
                continue
            now = loop.time()
            if want <= set(self.seen):
                quiet_until = quiet_until or now + 0.5
                if now >= quiet_until:
                    return
            elif now > deadline:
                raise AssertionError(f"{len(want - set(self.seen))} of {len(want)} never arrived")


async def ledger_rows(pool: asyncpg.Pool, n: int, *, pending: bool) -> list[uuid.UUID]:
    """``n`` answered saves in the ledger, their invalidations pending or not."""
    ids = [uuid.uuid4() for _ in range(n)]
    async with pool.acquire() as conn:
        await conn.executemany(
            "INSERT INTO ltm_processed_events (event_id, tool_call_id, tool_name, shard_id, status,"
            " invalidation, invalidation_pending_since)"
            " VALUES ($1, 'c', 'create_long_term_memory', 1, 'memory_saved_successfully', $2, $3)",
            [(i, invalidation(i), datetime.now(UTC) if pending else None) for i in ids],
        )
    return ids


def invalidation(event_id: uuid.UUID) -> dict[str, object]:
    return {
        "schema_version": 1,
        "invalidation_id": invalidation_id(event_id),
        "kind": "user",
        "user_disc_id": "1" * 18,
    }


@pytest.fixture
async def redis_proxy(redis_url: str) -> AsyncIterator[CuttableProxy]:
    parts = urlsplit(redis_url)
    proxy = await CuttableProxy(parts.hostname or "127.0.0.1", parts.port or 6379).start()
    try:
        yield proxy
    finally:
        await proxy.close()


async def test_redis_up_publishes_at_once_and_marks_nothing(pool: asyncpg.Pool, redis_url: str) -> None:
    channel = f"ltm-test-{uuid.uuid4().hex}"
    cache = InvalidationPublisher(redis_url, channel)
    outbox = InvalidationOutbox(pool, cache)
    [event_id] = await ledger_rows(pool, 1, pending=False)
    async with Subscriber(redis_url, channel) as sub:
        await outbox.publish(event_id, invalidation(event_id))
        await sub.collect({invalidation_id(event_id)})
    assert await pool.fetchval(PENDING) == 0
    await cache.close()


async def test_redis_down_marks_pending_and_publishes_once_it_is_back(
    pool: asyncpg.Pool, redis_url: str, redis_proxy: CuttableProxy
) -> None:
    channel = f"ltm-test-{uuid.uuid4().hex}"
    cache = InvalidationPublisher(redis_proxy.url(redis_url), channel, pause=0.01)
    backlog: list[int] = []
    outbox = InvalidationOutbox(pool, cache, on_backlog=backlog.append, probe_seconds=0.05)
    ids = await ledger_rows(pool, 30, pending=False)
    async with Subscriber(redis_url, channel) as sub:
        await redis_proxy.cut()
        await asyncio.gather(*(outbox.publish(i, invalidation(i)) for i in ids))  # returns: nothing waits
        assert outbox.redis_down
        assert await pool.fetchval(PENDING) == 30
        outbox.start()
        await asyncio.sleep(0.3)  # it probes, Redis does not answer, nothing is published or cleared
        assert await pool.fetchval(PENDING) == 30
        await redis_proxy.restore()
        await sub.collect({invalidation_id(i) for i in ids})
    assert set(sub.seen.values()) == {1}
    assert await pool.fetchval(PENDING) == 0
    assert backlog[-1] == 0
    assert not outbox.redis_down
    await outbox.close()
    await cache.close()


async def test_workers_share_a_backlog_and_publish_each_row_once(pool: asyncpg.Pool, redis_url: str) -> None:
    channel = f"ltm-test-{uuid.uuid4().hex}"
    ids = await ledger_rows(pool, 1200, pending=True)  # more than one sweep batch (500)
    caches = [InvalidationPublisher(redis_url, channel) for _ in range(3)]
    outboxes = [InvalidationOutbox(pool, cache) for cache in caches]
    async with Subscriber(redis_url, channel) as sub:
        for outbox in outboxes:
            outbox.start()  # each sweeps at once
        await sub.collect({invalidation_id(i) for i in ids}, timeout=30)
    assert set(sub.seen.values()) == {1}, "a pending row was published twice"
    assert await pool.fetchval(PENDING) == 0
    for outbox, cache in zip(outboxes, caches, strict=True):
        await outbox.close()
        await cache.close()


async def test_postgres_down_during_a_sweep_is_not_taken_for_redis(migrated_dsn: str, redis_url: str) -> None:
    """A sweep that cannot reach Postgres (connection refused, an OSError like a socket error from Redis)
    leaves Redis marked up and waits for the next sweep; the rows are published once Postgres is back."""
    parts = urlsplit(migrated_dsn)
    proxy = await CuttableProxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    pool = await create_pool(proxy.url(migrated_dsn), size=2)
    channel = f"ltm-test-{uuid.uuid4().hex}"
    cache = InvalidationPublisher(redis_url, channel)
    sweeps = 0
    outbox = InvalidationOutbox(pool, cache, sweep_seconds=0.3)
    real_sweep = outbox._sweep

    async def counted_sweep() -> None:
        nonlocal sweeps
        sweeps += 1
        await real_sweep()

    outbox._sweep = counted_sweep  # type: ignore[method-assign]
    try:
        ids = await ledger_rows(pool, 5, pending=True)
        await proxy.cut()
        await pool.expire_connections()
        async with Subscriber(redis_url, channel) as sub:
            outbox.start()
            await asyncio.sleep(1.0)
            assert not outbox.redis_down, "a Postgres failure was taken for Redis"
            assert sweeps <= 5, f"{sweeps} sweeps in 1 s: the outbox loops instead of waiting"
            await proxy.restore()
            await sub.collect({invalidation_id(i) for i in ids})
        assert set(sub.seen.values()) == {1}
    finally:
        await outbox.close()
        await cache.close()
        pool.terminate()
        await proxy.close()
