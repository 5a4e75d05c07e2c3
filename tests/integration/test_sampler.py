"""The metrics sampler against a real broker: queue depths and consumers from passive declares, missing queues
and an unreachable broker leave no stale series, and the dependency check runs every sample; each recorded
shard's own queue depth (ltm_shard_events_queued) once the worker has its Postgres pool."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import aio_pika
import asyncpg
import pytest

from tests.support.proxy import CuttableProxy
from worker.broker.topology import shard_queue_name
from worker.config import Topology
from worker.observability import sampler as sampler_module
from worker.observability.metrics import Metrics
from worker.observability.sampler import Sampler
from worker.store.pool import create_pool
from worker.store.shard_queues import register_shard, registered_shards
from worker.testing.workers import free_port

pytestmark = pytest.mark.integration


def series(metrics: Metrics) -> dict[str, tuple[float, float]]:
    """queue -> (messages, consumers) as the gauges hold them now."""
    found: dict[str, list[float]] = {}
    for gauge in (metrics.queue_messages, metrics.queue_consumers):
        for family in gauge.collect():
            for sample in family.samples:
                found.setdefault(sample.labels["queue"], []).append(sample.value)
    return {queue: (values[0], values[1]) for queue, values in found.items()}


def queued(metrics: Metrics) -> dict[str, float]:
    """shard -> ltm_shard_events_queued as the gauge holds it now."""
    return {
        sample.labels["shard"]: sample.value
        for family in metrics.shard_events_queued.collect()
        for sample in family.samples
    }


async def nothing() -> None:
    """A dependency check with nothing to say."""


TOPOLOGY = Topology()
QUORUM = {"x-queue-type": "quorum"}


async def shard_queue(channel: aio_pika.abc.AbstractChannel, shard_id: int, events: int = 0) -> None:
    """Shard ``shard_id``'s own queue with ``events`` waiting in it."""
    name = shard_queue_name(TOPOLOGY, shard_id)
    await channel.declare_queue(name, durable=True, arguments=QUORUM)
    for n in range(events):
        await channel.default_exchange.publish(aio_pika.Message(b"%d" % n), routing_key=name)


def sampling_shards(sampler: Sampler, pool: asyncpg.Pool) -> Sampler:
    """``sampler`` reading the recorded shards from ``pool``, as worker/bootstrap.py wires it."""
    sampler.sample_shards(
        functools.partial(registered_shards, pool), functools.partial(shard_queue_name, TOPOLOGY)
    )
    return sampler


async def test_it_reports_ready_messages_and_consumers_of_each_queue(rabbitmq_url: str) -> None:
    refreshed = 0

    async def refresh() -> None:
        nonlocal refreshed
        refreshed += 1

    metrics = Metrics()
    sampler = Sampler(rabbitmq_url, ["work", "dlq", "not-declared"], metrics, refresh)
    connection = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await connection.channel()
        args = {"x-queue-type": "quorum"}
        work = await channel.declare_queue("work", durable=True, arguments=args)
        await channel.declare_queue("dlq", durable=True, arguments=args)
        for n in range(3):
            await channel.default_exchange.publish(aio_pika.Message(b"%d" % n), routing_key="dlq")
        consumer_channel = await connection.channel()
        await consumer_channel.set_qos(prefetch_count=1)
        consumer = await consumer_channel.get_queue("work")

        async def hold(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            """Take it and never settle it: the consumer stays."""

        await consumer.consume(hold)

        await sampler.sample_once()
        # a missing queue closed the sampler's channel: the queues after it are still sampled
        assert series(metrics) == {"work": (0, 1), "dlq": (3, 0)}
        assert refreshed == 1

        await work.delete(if_unused=False, if_empty=False)
        await sampler.sample_once()
        assert series(metrics) == {"dlq": (3, 0)}, "a queue that went away must not keep its last value"
        assert refreshed == 2
    finally:
        await sampler.close()
        await connection.close()


async def test_an_unreachable_broker_clears_the_queue_series_and_still_checks_dependencies() -> None:
    refreshed = 0

    async def refresh() -> None:
        nonlocal refreshed
        refreshed += 1
        raise RuntimeError("a failing check must not stop the sampling")

    metrics = Metrics()
    metrics.queue_messages.labels("dlq").set(7)  # from before the outage
    sampler = Sampler(f"amqp://guest:guest@127.0.0.1:{free_port()}/", ["dlq"], metrics, refresh)
    try:
        await sampler.sample_once()
        await sampler.sample_once()
    finally:
        await sampler.close()
    assert series(metrics) == {}
    assert refreshed == 2


async def test_it_reports_the_depth_of_each_recorded_shards_own_queue(
    rabbitmq_url: str, pool: asyncpg.Pool
) -> None:
    metrics = Metrics()
    sampler = Sampler(rabbitmq_url, ["work"], metrics, nothing)
    connection = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await connection.channel()
        await channel.declare_queue("work", durable=True, arguments=QUORUM)
        await shard_queue(channel, 3, events=4)
        await shard_queue(channel, 7)
        await shard_queue(channel, 12, events=2)  # a queue no worker recorded: not a shard's to report
        for shard_id in (3, 7, 9):  # 9: recorded, its queue deleted (a shard gone after resharding)
            await register_shard(pool, shard_id)

        await sampler.sample_once()
        assert queued(metrics) == {}, "no shard is sampled before the worker has its pool"

        sampling_shards(sampler, pool)
        await sampler.sample_once()
        # the missing queue of shard 9 closed the sampler's channel: the shards after it are still sampled
        assert queued(metrics) == {"3": 4, "7": 0}
        assert series(metrics) == {"work": (0, 0)}, "the shards' queues are not ltm_queue_messages' series"

        await channel.queue_delete(shard_queue_name(TOPOLOGY, 7))
        await pool.execute("DELETE FROM ltm_shard_queues WHERE shard_id = 3")
        await shard_queue(channel, 9, events=1)
        await sampler.sample_once()
        # a shard whose queue went away, or that is no longer recorded, has no series
        assert queued(metrics) == {"9": 1}
    finally:
        await sampler.close()
        await connection.close()


async def test_postgres_unreadable_removes_the_shards_series_and_keeps_the_queues(
    rabbitmq_url: str, migrated_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sampler_module, "SHARDS_TIMEOUT_SECONDS", 0.5)
    metrics = Metrics()
    sampler = Sampler(rabbitmq_url, ["work"], metrics, nothing)
    own_pool = await create_pool(migrated_dsn, size=1)
    connection = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await connection.channel()
        await channel.declare_queue("work", durable=True, arguments=QUORUM)
        await shard_queue(channel, 5, events=3)
        await register_shard(own_pool, 5)
        sampling_shards(sampler, own_pool)
        await sampler.sample_once()
        assert queued(metrics) == {"5": 3}

        async with own_pool.acquire():  # the pool's one connection busy (batches holding them all)
            # the read gives up after SHARDS_TIMEOUT_SECONDS (the generous guard: a hang fails, not stalls)
            await asyncio.wait_for(sampler.sample_once(), timeout=60)
        assert queued(metrics) == {}, "shards that cannot be listed must not keep their last depth"
        assert series(metrics) == {"work": (0, 0)}, "a slow Postgres must not stop the queues' sampling"

        await sampler.sample_once()
        assert queued(metrics) == {"5": 3}

        await own_pool.close()  # every later read of the recorded shards fails at once
        await sampler.sample_once()
        assert queued(metrics) == {}
        assert series(metrics) == {"work": (0, 0)}
    finally:
        await sampler.close()
        await connection.close()
        own_pool.terminate()


@pytest.fixture
async def rabbitmq_proxy(rabbitmq_url: str) -> AsyncIterator[CuttableProxy]:
    parts = urlsplit(rabbitmq_url)
    proxy = await CuttableProxy(parts.hostname or "127.0.0.1", parts.port or 5672).start()
    try:
        yield proxy
    finally:
        await proxy.close()


async def test_a_broker_outage_removes_every_queue_and_shard_series_until_it_ends(
    rabbitmq_url: str, pool: asyncpg.Pool, rabbitmq_proxy: CuttableProxy
) -> None:
    metrics = Metrics()
    sampler = sampling_shards(Sampler(rabbitmq_proxy.url(rabbitmq_url), ["work"], metrics, nothing), pool)
    connection = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await connection.channel()
        await channel.declare_queue("work", durable=True, arguments=QUORUM)
        await shard_queue(channel, 2, events=1)
        await register_shard(pool, 2)
        await sampler.sample_once()
        assert (series(metrics), queued(metrics)) == ({"work": (0, 0)}, {"2": 1})

        await rabbitmq_proxy.cut()
        await sampler.sample_once()
        assert (series(metrics), queued(metrics)) == ({}, {})

        await rabbitmq_proxy.restore()
        await sampler.sample_once()
        assert (series(metrics), queued(metrics)) == ({"work": (0, 0)}, {"2": 1})
    finally:
        await sampler.close()
        await connection.close()
