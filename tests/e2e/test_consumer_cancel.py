"""The broker cancels the worker's consumer (its queue was deleted): the worker notices, declares the
topology again and goes on consuming. aio-pika does not restore a consumer the broker cancelled."""

from __future__ import annotations

import aio_pika
import pytest

from tests.e2e.conftest import Stack
from tests.e2e.harness import Shard
from tests.factories import event_body

pytestmark = pytest.mark.e2e


async def test_a_deleted_work_queue_is_declared_again_and_consumed(stack: Stack) -> None:
    world = await stack.rows.world()
    worker = stack.worker()
    await worker.wait_for_log("consuming")

    connection = await aio_pika.connect(stack.rabbitmq_url)
    try:
        channel = await connection.channel()
        await channel.queue_delete("ltm.create_memory")
    finally:
        await connection.close()
    await worker.wait_for_log("rabbitmq cancelled the consumer; reconnecting", timeout=15)
    await worker.wait_for_log("consuming", at_least=2, timeout=30)

    body = event_body(
        {"memory_content": "after the queue came back", "memory_scope": "server_wide"},
        persona_id=world.persona_id,
    )
    async with Shard(stack.rabbitmq_url) as shard:
        await shard.publish(body)
        await shard.wait_for_results([body["event_id"]], timeout=30)
    assert shard.received.results[body["event_id"]][0]["success"] is True
