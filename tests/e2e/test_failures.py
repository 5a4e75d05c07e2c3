"""Every way an event can fail ends somewhere a person can see: the DLQ with x-ltm-* headers, and a
failure result for the waiting shard when its ids can be read. Real services, the worker as a process:
here the outages (a Postgres cut off) and the replay; unreadable bodies and failing steps are tested with
the worker in process (tests/integration/test_worker.py)."""

from __future__ import annotations

from datetime import datetime
from urllib.parse import urlsplit

import pytest

from contracts.models import DeadLetterKind, Status
from tests.e2e.stack import Stack
from tests.factories import event_body
from tests.support.harness import Shard, take_dead_letters
from tests.support.proxy import CuttableProxy

pytestmark = pytest.mark.e2e

KIND, ERROR, ATTEMPTS, FAILED_AT = "x-ltm-error-kind", "x-ltm-error", "x-ltm-attempts", "x-ltm-failed-at"


def assert_headers(headers: dict, kind: str, attempts: int, error_contains: str) -> None:  # type: ignore[type-arg]
    assert headers[KIND] == kind
    assert headers[ATTEMPTS] == attempts
    assert error_contains in headers[ERROR]
    assert "\n" not in headers[ERROR]
    assert datetime.fromisoformat(headers[FAILED_AT].replace("Z", "+00:00")).tzinfo is not None


@pytest.fixture
async def postgres_proxy(stack: Stack):  # type: ignore[no-untyped-def]
    parts = urlsplit(stack.postgres_dsn)
    proxy = await CuttableProxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    try:
        yield proxy
    finally:
        await proxy.close()


async def test_postgres_down_longer_than_the_retry_budget(
    stack: Stack, postgres_proxy: CuttableProxy
) -> None:
    world = await stack.rows.world()
    stack.worker(LTM_POSTGRES_DSN=postgres_proxy.url(stack.postgres_dsn), LTM_RETRY_MAX_ATTEMPTS="3")
    await stack.workers_ready()
    body = event_body({"memory_content": "fact", "memory_scope": "server_wide"}, persona_id=world.persona_id)
    async with Shard(stack.rabbitmq_url) as shard:
        await postgres_proxy.cut()
        await shard.publish(body)
        [letter] = await take_dead_letters(stack.rabbitmq_url, 1, timeout=30)
        await shard.wait_for_results([body["event_id"]], timeout=15)

    assert_headers(letter.headers, DeadLetterKind.TRANSIENT_EXHAUSTED, 3, "")
    assert letter.routing_key == "tool.create_long_term_memory"  # the original key, not the retry queue's
    [result] = shard.received.results[body["event_id"]]
    assert result["status"] == Status.DB_ERROR
    assert result["error"] == "Database error occurred while saving memory"
    retries = [
        line for line in stack.workers[0].lines() if line.get("event") == "transient fault; retrying later"
    ]
    assert [line["attempts"] for line in retries] == [1, 2]


async def test_postgres_blip_shorter_than_the_budget_ends_normally(
    stack: Stack, postgres_proxy: CuttableProxy
) -> None:
    world = await stack.rows.world()
    worker = stack.worker(LTM_POSTGRES_DSN=postgres_proxy.url(stack.postgres_dsn), LTM_RETRY_MAX_ATTEMPTS="8")
    await stack.workers_ready()
    body = event_body({"memory_content": "fact", "memory_scope": "server_wide"}, persona_id=world.persona_id)
    async with Shard(stack.rabbitmq_url) as shard:
        await postgres_proxy.cut()
        await shard.publish(body)
        await worker.wait_for_log("transient fault; retrying later", at_least=2, timeout=15)
        await postgres_proxy.restore()
        await shard.wait_for_results([body["event_id"]], timeout=30)

    [result] = shard.received.results[body["event_id"]]
    assert result["success"] is True
    # the line comes after the ack, which comes after the result: on a busy machine the shard has it first
    await worker.wait_for_log("event processed")
    [processed] = [line for line in worker.lines() if line.get("event") == "event processed"]
    assert processed["attempts"] > 1
    assert await stack.rows.conn.fetchval("SELECT count(*) FROM server_memories") == 1
    assert (
        await stack.rows.conn.fetchval("SELECT attempts FROM ltm_processed_events") == processed["attempts"]
    )


async def test_an_unroutable_result_is_an_error_and_a_replay_delivers_it(stack: Stack) -> None:
    """No queue is bound for the event's shard: the confirmed, mandatory publish comes back, the event
    retries and ends in the DLQ (the memory saved once, its outcome in the ledger); once the shard's
    queue exists, replaying the letter delivers the stored result."""
    world = await stack.rows.world()
    worker = stack.worker(LTM_RETRY_MAX_ATTEMPTS="2")
    await stack.workers_ready()
    body = event_body(
        {"memory_content": "for a shard that is not there", "memory_scope": "server_wide"},
        persona_id=world.persona_id,
        shard_id=99,
    )
    async with Shard(stack.rabbitmq_url, shard_id=3) as other_shard:
        await other_shard.publish(body)
        [letter] = await take_dead_letters(stack.rabbitmq_url, 1, timeout=30)
    assert_headers(
        letter.headers, DeadLetterKind.TRANSIENT_EXHAUSTED, 2, "shard 99 has no queue bound for its results"
    )
    assert await stack.rows.conn.fetchval("SELECT count(*) FROM server_memories") == 1
    assert await stack.rows.conn.fetchval("SELECT status FROM ltm_processed_events") == Status.SAVED
    assert worker.count("transient fault; retrying later") == 1

    async with Shard(stack.rabbitmq_url, shard_id=99) as shard:
        # the letter goes back to the work queue as `worker dlq replay` sends it
        await shard.publish(letter.body, headers={"x-ltm-replay-count": 1})
        await shard.wait_for_results([body["event_id"]], timeout=30)
    [result] = shard.received.results[body["event_id"]]
    assert result["success"] is True
    assert result["replayed"] is True
    assert await stack.rows.conn.fetchval("SELECT count(*) FROM server_memories") == 1
