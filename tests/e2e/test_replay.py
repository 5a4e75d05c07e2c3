"""Dead letters from a long Postgres outage, replayed after recovery with `worker dlq replay`: every event
ends with exactly one memory row, and replaying the same letters twice changes nothing."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from urllib.parse import urlsplit

import aio_pika
import pytest

from contracts.models import Status
from tests.e2e.stack import Stack
from tests.factories import event_body
from tests.support.harness import REPO, Shard, queue_depth
from tests.support.proxy import CuttableProxy

pytestmark = pytest.mark.e2e

EVENTS = 20
DLQ = "ltm.create_memory.dlq"


async def wait_depth(url: str, queue: str, depth: int, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while (current := await queue_depth(url, queue)) != depth:
        assert asyncio.get_running_loop().time() < deadline, f"{queue} holds {current}, expected {depth}"
        await asyncio.sleep(0.2)


async def double_the_dead_letters(url: str) -> None:
    """Put every dead letter in the DLQ twice: the same letters, replayed twice in one go."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        dlq = await channel.declare_queue(DLQ, passive=True)
        exchange = await channel.get_exchange("tomori.dead_letter")
        taken = []
        while (message := await dlq.get(fail=False)) is not None:
            taken.append(message)
        for message in taken:
            for _ in range(2):
                copy = aio_pika.Message(
                    message.body,
                    headers=dict(message.headers or {}),
                    content_type=message.content_type,
                    delivery_mode=2,
                    message_id=message.message_id,
                    correlation_id=message.correlation_id,
                    type=message.type,
                )
                await exchange.publish(copy, message.routing_key or "")
        for message in taken:
            await message.ack()
        await asyncio.sleep(0.5)  # acks on a quorum queue right before a close (rabbitmq-server#10327)
    finally:
        await connection.close()


async def test_outage_dead_letters_replayed_twice_save_each_memory_once(stack: Stack) -> None:
    world = await stack.rows.world()
    parts = urlsplit(stack.postgres_dsn)
    proxy = await CuttableProxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    try:
        stack.worker(LTM_POSTGRES_DSN=proxy.url(stack.postgres_dsn), LTM_RETRY_MAX_ATTEMPTS="2")
        await stack.workers_ready()
        bodies = [
            event_body(
                {"memory_content": f"fact {n}", "memory_scope": "server_wide"}, persona_id=world.persona_id
            )
            for n in range(EVENTS)
        ]
        ids = [body["event_id"] for body in bodies]
        async with Shard(stack.rabbitmq_url) as shard:
            await proxy.cut()  # the outage: longer than the retry budget
            for body in bodies:
                await shard.publish(body)
            await wait_depth(stack.rabbitmq_url, DLQ, EVENTS)
            await shard.wait_for_results(ids, timeout=30)
            assert {r[0]["status"] for r in shard.received.results.values()} == {Status.DB_ERROR}
            assert await stack.rows.conn.fetchval("SELECT count(*) FROM server_memories") == 0

            await proxy.restore()  # recovery
            await double_the_dead_letters(stack.rabbitmq_url)
            await wait_depth(stack.rabbitmq_url, DLQ, 2 * EVENTS)
            replay = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "worker", "dlq", "replay"],
                cwd=REPO,
                env=stack.env(),
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert replay.returncode == 0, replay.stdout + replay.stderr
            assert f"moved {2 * EVENTS}" in replay.stdout + replay.stderr

            deadline = asyncio.get_running_loop().time() + 60
            while sum(len(shard.received.results[i]) for i in ids) < 3 * EVENTS:
                assert asyncio.get_running_loop().time() < deadline, "not every replayed letter was answered"
                await asyncio.sleep(0.1)

        for event_id in ids:
            failure, *answers = shard.received.results[event_id]
            assert failure["status"] == Status.DB_ERROR
            saved = [a for a in answers if not a["replayed"]]
            replayed = [a for a in answers if a["replayed"]]
            assert len(saved) == 1, answers  # processed for real once...
            assert saved[0]["status"] == Status.SAVED
            assert len(replayed) == 1  # ...and answered from the ledger the second time
            assert {**replayed[0], "replayed": False} == saved[0]
        assert await stack.rows.conn.fetchval("SELECT count(*) FROM server_memories") == EVENTS
        assert await stack.rows.conn.fetchval("SELECT count(DISTINCT content) FROM server_memories") == EVENTS
        assert await stack.rows.conn.fetchval("SELECT count(*) FROM ltm_processed_events") == EVENTS
        assert await queue_depth(stack.rabbitmq_url, DLQ) == 0
    finally:
        await proxy.close()
