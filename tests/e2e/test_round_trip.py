"""A shard publishes raw JSON per CONTRACT.md and receives everything the contract promises."""

from __future__ import annotations

import asyncio
import json

import pytest

from contracts.models import Status
from tests.e2e.stack import Stack
from tests.factories import GUILD, event_body, member
from tests.support.harness import InvalidationListener, Shard, invalidation_key

pytestmark = pytest.mark.e2e

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
SPARROW = "1150000000000000201"


@pytest.mark.pgbouncer
async def test_server_and_personal_saves_reach_the_shard_and_redis(stack: Stack) -> None:
    world = await stack.rows.world()
    await stack.rows.user(SPARROW)
    stack.worker()
    await stack.workers_ready()
    server_event = event_body(
        {"memory_content": "{user} likes dogs", "memory_scope": "server_wide"}, persona_id=world.persona_id
    )
    personal_event = event_body(
        {"memory_content": "{user} likes cats", "memory_scope": "target_user", "target_user": "Sparrow"},
        persona_id=world.persona_id,
        members=[member(SPARROW, "sparrow_ow", "Sparrow")],
        tool_name="remember_this_fact",
    )

    async with Shard(stack.rabbitmq_url) as shard, InvalidationListener(stack.redis_url) as redis:
        await shard.publish(server_event, headers={"traceparent": TRACEPARENT})
        await shard.publish(personal_event, routing_key="tool.remember_this_fact")
        await shard.wait_for_results([server_event["event_id"], personal_event["event_id"]], timeout=30)
        await asyncio.sleep(0.5)  # let notices and invalidations land

    event_id = server_event["event_id"]
    [result] = shard.received.results[event_id]
    [message] = shard.received.result_messages[event_id]
    assert message.routing_key == "shard.3"
    assert message.exchange == "tomori.tool_results"
    assert message.message_id == f"result:{event_id}"
    assert message.correlation_id == server_event["tool_call_id"]
    assert message.type == "tool_result.v1"
    assert message.content_type == "application/json"
    assert message.delivery_mode == 2
    assert message.headers["traceparent"] == TRACEPARENT
    assert result["success"] is True
    assert result["status"] == Status.SAVED
    assert result["replayed"] is False
    assert result["data"]["scope"] == "server_wide"
    memory_id = result["data"]["memory_id"]
    assert (
        await stack.rows.conn.fetchval(
            "SELECT content FROM server_memories WHERE server_memory_id = $1", memory_id
        )
        == "{user} likes dogs"
    )

    [notice] = shard.received.notices[event_id]
    [notice_message] = shard.received.notice_messages[event_id]
    assert notice_message.message_id == f"notice:{event_id}"
    assert notice_message.type == "notification.v1"
    assert notice_message.correlation_id == server_event["tool_call_id"]
    assert notice_message.headers["traceparent"] == TRACEPARENT
    assert notice["notice"]["kind"] == "server_memory"
    assert notice["channel_disc_id"] == server_event["context"]["channel_disc_id"]
    assert redis.of(event_id) == [
        {
            "schema_version": 1,
            "invalidation_id": invalidation_key(event_id),
            "kind": "tomori_state",
            "server_disc_id": GUILD,
        }
    ]

    personal_id = personal_event["event_id"]
    [personal] = shard.received.results[personal_id]
    assert personal["tool_name"] == "remember_this_fact"
    assert personal["data"]["target_user"] == "Sparrow (@sparrow_ow)"
    assert shard.received.notices[personal_id][0]["notice"]["kind"] == "personal_memory"
    assert redis.of(personal_id) == [
        {
            "schema_version": 1,
            "invalidation_id": invalidation_key(personal_id),
            "kind": "user",
            "user_disc_id": SPARROW,
        }
    ]
    # the channel every shard reads names no event id
    published_text = json.dumps(redis.messages)
    assert event_id not in published_text
    assert personal_id not in published_text

    log = [line for line in stack.workers[0].lines() if line.get("event") == "event processed"]
    assert {line["event_id"] for line in log} == {event_id, personal_id}
    assert all(line["attempts"] == 1 and "duration_ms" in line for line in log)


async def test_a_failure_result_has_no_notice_and_no_invalidation(stack: Stack) -> None:
    world = await stack.rows.world(self_teaching=False)
    stack.worker()
    await stack.workers_ready()
    body = event_body({"memory_content": "x", "memory_scope": "server_wide"}, persona_id=world.persona_id)
    async with Shard(stack.rabbitmq_url) as shard, InvalidationListener(stack.redis_url) as redis:
        await shard.publish(body)
        await shard.wait_for_results([body["event_id"]], timeout=30)
        await asyncio.sleep(0.5)
    [result] = shard.received.results[body["event_id"]]
    assert result["success"] is False
    assert result["status"] == Status.DISABLED
    assert result["message"] is None
    assert result["error"] == "Self-teaching is disabled for this server"
    assert body["event_id"] not in shard.received.notices
    assert not redis.of(body["event_id"])


async def test_a_redelivered_event_is_answered_from_the_store(stack: Stack) -> None:
    world = await stack.rows.world()
    stack.worker()
    await stack.workers_ready()
    body = event_body({"memory_content": "fact", "memory_scope": "server_wide"}, persona_id=world.persona_id)
    async with Shard(stack.rabbitmq_url) as shard:
        await shard.publish(body)
        await shard.wait_for_results([body["event_id"]], timeout=30)
        await shard.publish(body)  # the same event again, as after a crash before the ack
        deadline = asyncio.get_running_loop().time() + 30
        while len(shard.received.results[body["event_id"]]) < 2:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
    first, second = shard.received.results[body["event_id"]]
    assert first["replayed"] is False
    assert second["replayed"] is True
    assert {**second, "replayed": False} == first
    assert await stack.rows.conn.fetchval("SELECT count(*) FROM server_memories") == 1
