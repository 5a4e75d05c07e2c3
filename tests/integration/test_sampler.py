"""The metrics sampler against a real broker: queue depths and consumers from passive declares, missing queues
and an unreachable broker leave no stale series, and the dependency check runs every sample."""

from __future__ import annotations

import aio_pika
import pytest

from tests.e2e.harness import free_port
from worker.observability.metrics import Metrics
from worker.observability.sampler import Sampler

pytestmark = pytest.mark.integration


def series(metrics: Metrics) -> dict[str, tuple[float, float]]:
    """queue -> (messages, consumers) as the gauges hold them now."""
    found: dict[str, list[float]] = {}
    for gauge in (metrics.queue_messages, metrics.queue_consumers):
        for family in gauge.collect():
            for sample in family.samples:
                found.setdefault(sample.labels["queue"], []).append(sample.value)
    return {queue: (values[0], values[1]) for queue, values in found.items()}


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
