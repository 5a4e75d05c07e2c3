"""The kept dead letters: every dead letter a worker makes (or the broker makes) reaches ``ltm_dead_letters``
through the copies queue, once, with what it said of itself, while the DLQ keeps its own copy; a keeper that
cannot write to Postgres keeps nothing back and loses nothing. Real Postgres and RabbitMQ, a worker in the
test's event loop (tests/integration/test_worker.py's harness)."""

from __future__ import annotations

from typing import Any

import aio_pika
import asyncpg
import orjson
import pytest

from tests.factories import BotRows, event_body
from tests.support.harness import queue_depth
from tests.support.inprocess import Workers
from tests.support.wait import eventually
from worker.config import Topology

pytestmark = pytest.mark.integration

TOPOLOGY = Topology()
KEY = "tool.create_long_term_memory"


async def publish(url: str, body: bytes, *, key: str = KEY, headers: dict[str, Any] | None = None) -> None:
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        exchange = await channel.get_exchange(TOPOLOGY.tool_calls_exchange)
        await exchange.publish(aio_pika.Message(body, headers=headers or {}), routing_key=key)
    finally:
        await connection.close()


async def kept(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await conn.fetch("SELECT * FROM ltm_dead_letters ORDER BY kind")


async def test_each_dead_letter_is_kept_once_with_what_it_says_and_stays_in_the_dlq(
    workers: Workers, rows: BotRows, rabbitmq_url: str
) -> None:
    world = await rows.world()
    await workers.start()
    schema = event_body({"memory_content": "x", "memory_scope": "server_wide"}, persona_id=world.persona_id)
    schema["schema_version"] = 99
    await publish(rabbitmq_url, orjson.dumps(schema))
    await publish(rabbitmq_url, b"\xff not json", headers={"x-shard-note": "kept as it came"})

    async def both_kept() -> bool:
        return len(await kept(rows.conn)) == 2

    await eventually(both_kept, "two kept letters")
    malformed, wrong = await kept(rows.conn)
    assert (wrong["kind"], wrong["event_id"], wrong["shard_id"]) == ("schema", schema["event_id"], 3)
    assert wrong["guild_id"] == schema["context"]["guild_disc_id"]
    assert "schema_version" in wrong["error"]
    assert orjson.loads(wrong["body"]) == schema
    assert wrong["body_size"] == len(orjson.dumps(schema))
    assert wrong["state"] == "waiting"
    assert wrong["failed_at"] is not None
    # no event id in a body that is not JSON: the message id stands in, as `worker dlq list` shows it
    assert (malformed["kind"], malformed["guild_id"]) == ("malformed", None)
    assert malformed["event_id"] == malformed["message_id"] is not None
    assert bytes(malformed["body"]) == b"\xff not json"
    assert orjson.loads(malformed["headers"])["x-shard-note"] == "kept as it came"
    assert "x-ltm-failed-at" in orjson.loads(malformed["headers"])
    # the DLQ keeps its own copy; the copies queue is drained
    assert await queue_depth(rabbitmq_url, TOPOLOGY.dead_letter_queue) == 2
    assert await queue_depth(rabbitmq_url, TOPOLOGY.dead_letter_copies_queue) == 0


async def test_a_keeper_that_cannot_write_holds_the_copies_and_keeps_them_once_postgres_answers(
    workers: Workers, rows: BotRows, rabbitmq_url: str
) -> None:
    await workers.start()
    await rows.conn.execute("ALTER TABLE ltm_dead_letters RENAME TO ltm_dead_letters_away")
    for n in range(5):
        await publish(rabbitmq_url, f"not json {n}".encode())
    await workers.wait_for_log("could not keep dead letters in postgres; they wait in their queue")
    assert await queue_depth(rabbitmq_url, TOPOLOGY.dead_letter_queue) == 5
    await rows.conn.execute("ALTER TABLE ltm_dead_letters_away RENAME TO ltm_dead_letters")

    async def all_kept() -> bool:
        return await rows.conn.fetchval("SELECT count(*) FROM ltm_dead_letters") == 5

    await eventually(all_kept, "the five letters kept once Postgres takes them", timeout=30)
    # a second life of the worker finds nothing more to keep: no letter twice
    worker = await workers.start()
    assert await workers.stop(worker) == 0
    assert await rows.conn.fetchval("SELECT count(*) FROM ltm_dead_letters") == 5
    assert await queue_depth(rabbitmq_url, TOPOLOGY.dead_letter_copies_queue) == 0
