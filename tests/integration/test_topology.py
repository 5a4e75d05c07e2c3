"""The declared RabbitMQ topology behaves as CONTRACT.md and the retry design need (real broker)."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import pytest

from worker.broker.topology import DEFAULT_DELIVERY_LIMIT, declare_topology, retry_queue_name
from worker.config import Topology
from worker.service.policy import RetryPolicy

pytestmark = pytest.mark.integration

TOPOLOGY = Topology()


async def test_declaring_twice_is_idempotent_and_binds_both_routing_keys(rabbitmq_url: str) -> None:
    connection = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await connection.channel()
        await declare_topology(channel, TOPOLOGY, [1000, 2000])
        declared = await declare_topology(channel, TOPOLOGY, [1000, 2000])
        for key in ("tool.create_long_term_memory", "tool.remember_this_fact"):
            await declared.tool_calls.publish(aio_pika.Message(key.encode()), key)
        await asyncio.sleep(0.3)
        bodies = []
        while (message := await declared.work_queue.get(fail=False, no_ack=True)) is not None:
            bodies.append(message.body)
        assert sorted(bodies) == [b"tool.create_long_term_memory", b"tool.remember_this_fact"]
    finally:
        await connection.close()


async def test_a_message_redelivered_past_the_delivery_limit_reaches_the_dlq(rabbitmq_url: str) -> None:
    """A poison message (one that keeps coming back) is dead-lettered by the broker, never dropped."""
    connection = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await connection.channel()
        declared = await declare_topology(channel, TOPOLOGY, [])
        await declared.tool_calls.publish(
            aio_pika.Message(b'{"poison": true}', message_id="poison"), "tool.create_long_term_memory"
        )
        returns = 0
        deadline = time.monotonic() + 30
        dlq = await channel.declare_queue(TOPOLOGY.dead_letter_queue, passive=True)
        while time.monotonic() < deadline:
            message = await declared.work_queue.get(fail=False)
            if message is None:
                letter = await dlq.get(fail=False, no_ack=True)
                if letter is not None:
                    break
                await asyncio.sleep(0.05)
                continue
            await message.reject(requeue=True)
            returns += 1
        else:
            pytest.fail("the poison message never reached the DLQ")
        assert returns == DEFAULT_DELIVERY_LIMIT + 1
        assert letter.message_id == "poison"
        assert letter.headers["x-death"][0]["reason"] == "delivery_limit"
    finally:
        await connection.close()


async def test_a_retry_queue_hands_the_message_back_after_its_delay(rabbitmq_url: str) -> None:
    delays = RetryPolicy(max_attempts=3, base_delay_ms=200, max_delay_ms=1000).tiers()
    assert delays == [200, 400]
    connection = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await connection.channel()
        declared = await declare_topology(channel, TOPOLOGY, delays)
        started = time.monotonic()
        await channel.default_exchange.publish(
            aio_pika.Message(b"again", expiration=0.4, headers={"x-ltm-attempts": 1}),
            retry_queue_name(TOPOLOGY, 400),
        )
        while (message := await declared.work_queue.get(fail=False, no_ack=True)) is None:
            assert time.monotonic() - started < 10, "the retry queue never handed the message back"
            await asyncio.sleep(0.02)
        assert time.monotonic() - started >= 0.35
        assert message.body == b"again"
        assert message.headers["x-ltm-attempts"] == 1
    finally:
        await connection.close()
