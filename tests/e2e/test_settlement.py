"""Every delivery ends settled exactly once, whichever way it fails, and a dead letter is copied once however
often the worker restarts (issue: a delivery never settled, and a dead letter copied again per restart).

Each test leaves the worker no way to answer the shard (no queue bound for its shard), stops the worker
and checks the queues: nothing left in the work queue, exactly one dead letter.
"""

from __future__ import annotations

import asyncio
import json
import signal
import uuid

import aio_pika
import pytest

from contracts.models import DeadLetterKind
from tests.e2e.conftest import Stack
from tests.e2e.harness import Shard, WorkerProcess, queue_depth, take_dead_letters
from tests.factories import event_body
from worker.broker.topology import retry_queue_arguments
from worker.config import Topology

pytestmark = pytest.mark.e2e

WORK_QUEUE = "ltm.create_memory"
DLQ = "ltm.create_memory.dlq"
NOBODY = 77  # a shard with no queue bound to shard.77


async def stop(worker: WorkerProcess) -> None:
    worker.signal(signal.SIGTERM)
    assert await worker.wait_exit(timeout=30) == 0


async def wait_for_depth(url: str, queue: str, depth: int, timeout: float = 20.0) -> None:
    for _ in range(int(timeout / 0.1)):
        if await queue_depth(url, queue) == depth:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{queue} holds {await queue_depth(url, queue)} messages, not {depth}")


async def restart_twice_and_count(stack: Stack) -> tuple[int, int]:
    """Two more worker lives on the same queues; then (work queue depth, DLQ depth) with no worker."""
    for _ in range(2):
        worker = stack.worker()
        await worker.wait_for_log("consuming")
        await asyncio.sleep(1.0)  # time for a redelivered event to come back through it
        await stop(worker)
    return await queue_depth(stack.rabbitmq_url, WORK_QUEUE), await queue_depth(stack.rabbitmq_url, DLQ)


async def test_unreadable_event_for_an_unbound_shard_is_dead_lettered_once(stack: Stack) -> None:
    """The reproduction: a schema dead letter whose ids are readable, for a shard nobody listens for. The
    DLQ copy is confirmed, the failure result comes back unroutable, and the delivery is acked anyway."""
    worker = stack.worker()
    await worker.wait_for_log("consuming")
    body = {"schema_version": 1, "event_id": str(uuid.uuid4()), "tool_call_id": "c", "shard_id": NOBODY}
    async with Shard(stack.rabbitmq_url) as shard:
        await shard.publish(json.dumps(body).encode())
        await worker.wait_for_log("dead-lettered unreadable event")
    await stop(worker)

    [line] = [
        x
        for x in worker.lines()
        if x.get("event") == "failure result not delivered; the dead letter keeps the event"
    ]
    assert line["event_id"] == body["event_id"]
    assert line["shard_id"] == NOBODY
    assert "was not delivered" in line["error"]
    assert await queue_depth(stack.rabbitmq_url, WORK_QUEUE) == 0
    assert await queue_depth(stack.rabbitmq_url, DLQ) == 1

    assert await restart_twice_and_count(stack) == (0, 1)
    [letter] = await take_dead_letters(stack.rabbitmq_url, 1)
    assert letter.headers["x-ltm-error-kind"] == DeadLetterKind.SCHEMA
    assert json.loads(letter.body) == body


async def test_internal_failure_for_an_unbound_shard_is_dead_lettered_once(stack: Stack) -> None:
    """A valid event that hits a bug, for a shard nobody listens for: its failure result cannot be routed
    either, and the delivery is still acked once its DLQ copy is confirmed."""
    world = await stack.rows.world()
    await stack.rows.conn.execute("""
        CREATE FUNCTION forced_failure() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'forced failure'; END $$;
        CREATE TRIGGER forced_failure BEFORE INSERT ON server_memories
            FOR EACH ROW EXECUTE FUNCTION forced_failure();
    """)
    worker = stack.worker()
    await worker.wait_for_log("consuming")
    body = event_body(
        {"memory_content": "boom", "memory_scope": "server_wide"},
        persona_id=world.persona_id,
        shard_id=NOBODY,
    )
    async with Shard(stack.rabbitmq_url) as shard:
        await shard.publish(body)
        await worker.wait_for_log("failure result not delivered; the dead letter keeps the event")
    await stop(worker)

    assert await queue_depth(stack.rabbitmq_url, WORK_QUEUE) == 0
    assert await restart_twice_and_count(stack) == (0, 1)
    [letter] = await take_dead_letters(stack.rabbitmq_url, 1)
    assert letter.headers["x-ltm-error-kind"] == DeadLetterKind.INTERNAL
    assert letter.message_id == body["event_id"]


async def test_a_refused_retry_copy_hands_the_delivery_back(stack: Stack) -> None:
    """The broker refuses the retry copy (its retry queue was deleted under the worker): the delivery is
    handed back to the work queue instead of being held unacked, comes back, and once the retry queue
    exists again ends where a transient fault should (here: the DLQ, since its shard is never bound)."""
    world = await stack.rows.world()
    worker = stack.worker(LTM_RETRY_MAX_ATTEMPTS="2", LTM_RETRY_BASE_DELAY_MS="100")
    await worker.wait_for_log("consuming")
    retry_queue = "ltm.create_memory.retry.100"
    connection = await aio_pika.connect(stack.rabbitmq_url)
    try:
        channel = await connection.channel()
        await channel.queue_delete(retry_queue)
        body = event_body(
            {"memory_content": "handed back", "memory_scope": "server_wide"},
            persona_id=world.persona_id,
            shard_id=NOBODY,
        )
        async with Shard(stack.rabbitmq_url) as shard:
            await shard.publish(body)
            # the result is unroutable (transient), the retry copy is refused: handed back, and again
            await worker.wait_for_log("delivery not settled; handing it back to the queue", at_least=2)
            assert worker.count("could not route a failed event; it will be redelivered") >= 2
            await channel.declare_queue(
                retry_queue, durable=True, arguments=retry_queue_arguments(Topology())
            )
            [letter] = await take_dead_letters(stack.rabbitmq_url, 1, timeout=30)
    finally:
        await connection.close()
    await stop(worker)

    assert letter.headers["x-ltm-error-kind"] == DeadLetterKind.TRANSIENT_EXHAUSTED
    assert letter.message_id == body["event_id"]
    assert await queue_depth(stack.rabbitmq_url, WORK_QUEUE) == 0
    # handed back, redelivered and answered from the ledger: the memory was saved once
    assert await stack.rows.conn.fetchval("SELECT count(*) FROM server_memories") == 1
