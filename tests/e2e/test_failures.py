"""Every way an event can fail ends somewhere a person can see: the DLQ with x-ltm-* headers, and a
failure result for the waiting shard when its ids can be read. Real services, the worker as a process."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from urllib.parse import urlsplit

import pytest

from contracts.models import DeadLetterKind, Status
from tests.e2e.conftest import Stack
from tests.e2e.harness import Shard, take_dead_letters
from tests.e2e.proxy import CuttableProxy
from tests.factories import event_body

pytestmark = pytest.mark.e2e

KIND, ERROR, ATTEMPTS, FAILED_AT = "x-ltm-error-kind", "x-ltm-error", "x-ltm-attempts", "x-ltm-failed-at"


def assert_headers(headers: dict, kind: str, attempts: int, error_contains: str) -> None:  # type: ignore[type-arg]
    assert headers[KIND] == kind
    assert headers[ATTEMPTS] == attempts
    assert error_contains in headers[ERROR]
    assert "\n" not in headers[ERROR]
    assert datetime.fromisoformat(headers[FAILED_AT].replace("Z", "+00:00")).tzinfo is not None


async def test_unreadable_bodies_are_dead_lettered_at_once(stack: Stack) -> None:
    world = await stack.rows.world()
    stack.worker()
    await stack.workers_ready()
    unknown_version = event_body(
        {"memory_content": "x", "memory_scope": "server_wide"}, persona_id=world.persona_id
    )
    unknown_version["schema_version"] = 2
    missing_id = event_body({}, persona_id=world.persona_id)
    del missing_id["event_id"]
    huge = event_body(
        {"memory_content": "x" * 300 * 1024, "memory_scope": "server_wide"}, persona_id=world.persona_id
    )
    cases = {
        "not-json": (b"\xff\xfe not json at all", DeadLetterKind.MALFORMED, "not UTF-8 JSON"),
        "array": (b"[1, 2, 3]", DeadLetterKind.MALFORMED, "is not an object"),
        "missing-id": (json.dumps(missing_id).encode(), DeadLetterKind.SCHEMA, "event_id"),
        "version": (json.dumps(unknown_version).encode(), DeadLetterKind.SCHEMA, "schema_version"),
        "huge": (json.dumps(huge).encode(), DeadLetterKind.SCHEMA, "byte limit"),
    }
    async with Shard(stack.rabbitmq_url) as shard:
        for name, (body, _, _) in cases.items():
            await shard.publish(
                body, headers={"test-case": name, "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}
            )
        letters = await take_dead_letters(stack.rabbitmq_url, len(cases))
        # only the unknown schema_version still has readable ids: its shard is answered
        await shard.wait_for_results([unknown_version["event_id"]], timeout=15)

    by_case = {letter.headers["test-case"]: letter for letter in letters}
    assert set(by_case) == set(cases)
    for name, (body, kind, error) in cases.items():
        letter = by_case[name]
        assert_headers(letter.headers, kind, 1, error)
        assert letter.body == body  # body unchanged
        assert letter.routing_key == "tool.create_long_term_memory"
        assert letter.type is None or letter.type == "tool_call.v1"
    [result] = shard.received.results[unknown_version["event_id"]]
    assert result["status"] == Status.INTERNAL_ERROR
    assert result["success"] is False
    assert set(shard.received.results) == {unknown_version["event_id"]}
    assert stack.workers[0].proc is not None
    assert stack.workers[0].proc.poll() is None, "the worker died"


async def test_a_step_that_raises_is_an_internal_dead_letter_and_the_worker_goes_on(stack: Stack) -> None:
    world = await stack.rows.world()
    # a real failure inside the transaction that the worker does not expect (SQLSTATE P0001)
    await stack.rows.conn.execute("""
        CREATE FUNCTION forced_failure() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'forced failure for %', NEW.content; END $$;
        CREATE TRIGGER forced_failure BEFORE INSERT ON server_memories
            FOR EACH ROW WHEN (NEW.content = 'boom') EXECUTE FUNCTION forced_failure();
    """)
    stack.worker()
    await stack.workers_ready()
    bad = event_body({"memory_content": "boom", "memory_scope": "server_wide"}, persona_id=world.persona_id)
    good = event_body({"memory_content": "fine", "memory_scope": "server_wide"}, persona_id=world.persona_id)
    async with Shard(stack.rabbitmq_url) as shard:
        await shard.publish(bad)
        await shard.publish(good)
        await shard.wait_for_results([bad["event_id"], good["event_id"]], timeout=30)
        [letter] = await take_dead_letters(stack.rabbitmq_url, 1)

    assert_headers(letter.headers, DeadLetterKind.INTERNAL, 1, "RaiseError: forced failure for boom")
    assert letter.message_id == bad["event_id"]
    [failure] = shard.received.results[bad["event_id"]]
    assert failure["status"] == Status.INTERNAL_ERROR
    assert failure["error"] == "Internal bot error: the memory could not be processed"
    assert shard.received.results[good["event_id"]][0]["success"] is True
    # the failed event wrote nothing: no memory, no outcome, so a replay processes it for real
    assert (
        await stack.rows.conn.fetchval(
            "SELECT count(*) FROM ltm_processed_events WHERE event_id = $1", uuid.UUID(bad["event_id"])
        )
        == 0
    )
    assert await stack.rows.conn.fetchval("SELECT count(*) FROM server_memories") == 1
    tracebacks = [
        line for line in stack.workers[0].lines() if line.get("event") == "internal error; dead-lettered"
    ]
    assert tracebacks
    assert "Traceback" in tracebacks[0]["exception"]


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
    assert_headers(letter.headers, DeadLetterKind.TRANSIENT_EXHAUSTED, 2, "was not delivered")
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
