"""The review's attack through the broker (security review 3, section 4): shard 7 sends its own event under
the event id of shard 5's save. Before: shard 7 was answered from the ledger with shard 5's result and notice
(the memory's text, guild, channel, tool call id). Now: shard 7 gets the conflict refusal and no notice, the
event is dead-lettered as ``event_conflict``, nothing is written, the log names both shards and no content;
shard 5's own redelivery and a ``worker dlq replay`` of its event are still answered from the ledger; and
the invalidation channel no longer carries the event id at all."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aio_pika
import pytest

from contracts.models import DeadLetterKind, Status
from tests.e2e.stack import Stack
from tests.factories import event_body
from tests.support.harness import (
    InvalidationListener,
    Shard,
    invalidation_key,
    queue_depth,
    take_dead_letters,
)
from tests.support.wait import eventually

pytestmark = pytest.mark.e2e

VICTIM_GUILD = "1150000000000000777"
VICTIM_CHANNEL = "1150000000000000778"
SECRET = "VICTIM-PRIVATE: the door code is 4711"
ATTACK = "ATTACKER-OWN: remember me"
DLQ = "ltm.create_memory.dlq"


async def wait_depth(url: str, depth: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while (current := await queue_depth(url, DLQ)) != depth:
        assert time.monotonic() < deadline, f"{DLQ} holds {current}, expected {depth}"
        await asyncio.sleep(0.1)


async def dead_letter_as_worker_would(url: str, body: dict[str, Any]) -> None:
    """Put ``body`` in the DLQ as a ``transient_exhausted`` letter of an event whose save had committed (its
    result was never confirmed): the case a replay must still answer from the ledger."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange("tomori.dead_letter")
        message = aio_pika.Message(
            json.dumps(body).encode(),
            headers={
                "x-ltm-error": "PublishNotConfirmed: result not confirmed",
                "x-ltm-error-kind": "transient_exhausted",
                "x-ltm-attempts": 5,
                "x-ltm-failed-at": "2026-12-03T10:00:00Z",
            },
            content_type="application/json",
            delivery_mode=2,
            message_id=body["event_id"],
            correlation_id=body["tool_call_id"],
            type="tool_call.v1",
        )
        await exchange.publish(message, "tool.create_long_term_memory")
    finally:
        await connection.close()


async def test_a_shard_reusing_another_shards_event_id_is_refused(stack: Stack) -> None:
    attacker_world = await stack.rows.world()
    victim_server = await stack.rows.server(VICTIM_GUILD)
    victim_persona, _ = await stack.rows.persona(victim_server)
    worker = stack.worker()
    await stack.workers_ready()

    victim = event_body(
        {"memory_content": SECRET, "memory_scope": "server_wide"}, persona_id=victim_persona, shard_id=5
    )
    victim["context"]["guild_disc_id"] = VICTIM_GUILD
    victim["context"]["channel_disc_id"] = VICTIM_CHANNEL
    event_id = victim["event_id"]

    async with (
        Shard(stack.rabbitmq_url, 5) as shard5,
        Shard(stack.rabbitmq_url, 7) as shard7,
        InvalidationListener(stack.redis_url) as redis,
    ):
        await shard5.publish(victim)
        await shard5.wait_for_results([event_id], timeout=30)
        await eventually(lambda: redis.of(event_id), "the victim's invalidation")
        # what every shard reads on the channel: no event id to steal any more
        assert event_id not in json.dumps(redis.messages)
        saved_rows = await stack.rows.conn.fetch("SELECT * FROM ltm_processed_events")
        memories = await stack.rows.conn.fetchval("SELECT count(*) FROM server_memories")

        # the attack, with the id learnt some other way: shard 7's own event under shard 5's event id
        attack = event_body(
            {"memory_content": ATTACK, "memory_scope": "server_wide"},
            persona_id=attacker_world.persona_id,
            event_id=event_id,
            shard_id=7,
        )
        await shard7.publish(attack)
        await shard7.wait_for_results([event_id], timeout=30)
        await wait_depth(stack.rabbitmq_url, 1)

        # shard 5's own event again (a redelivery after a crash): still answered from the ledger
        await shard5.publish(victim)
        await eventually(lambda: len(shard5.received.results[event_id]) == 2, "shard 5's replayed answer")

        # a dead letter of shard 5's event, replayed by the operator, together with the conflict's letter
        await dead_letter_as_worker_would(stack.rabbitmq_url, victim)
        await wait_depth(stack.rabbitmq_url, 2)
        replay = await asyncio.to_thread(stack.cli, "dlq", "replay")
        assert replay.returncode == 0, replay.stdout + replay.stderr
        await eventually(lambda: len(shard5.received.results[event_id]) == 3, "the replayed letter's answer")
        await eventually(
            lambda: len(shard7.received.results[event_id]) == 2, "the replayed conflict's answer"
        )
        await wait_depth(stack.rabbitmq_url, 1)  # the conflict is dead-lettered again, nothing else
        await asyncio.sleep(0.5)  # a stray notice would arrive in this time
        await shard5.settle()
        await shard7.settle()

    # shard 7: the refusal, twice (its event and the replay of its letter); nothing of shard 5's event
    for refusal in shard7.received.results[event_id]:
        assert refusal["status"] == Status.INTERNAL_ERROR
        assert refusal["success"] is False
        assert refusal["replayed"] is False
        assert refusal["tool_call_id"] == attack["tool_call_id"]
        assert refusal["data"]["reason"].startswith("event_id conflict")
        text = json.dumps(refusal)
        for secret in (SECRET, VICTIM_GUILD, VICTIM_CHANNEL, victim["tool_call_id"], "memory_id"):
            assert secret not in text
    assert event_id not in shard7.received.notices
    # shard 5: its save, then two answers from the ledger, equal to it; one notice only
    first, *again = shard5.received.results[event_id]
    assert first["status"] == Status.SAVED
    assert first["replayed"] is False
    assert len(again) == 2
    for answer in again:
        assert answer["replayed"] is True
        assert {**answer, "replayed": False} == first
    assert len(shard5.received.notices[event_id]) == 3  # the save's notice, re-emitted with each answer
    assert all(n == shard5.received.notices[event_id][0] for n in shard5.received.notices[event_id])

    # nothing written by the attack: the ledger row and the memories are as after the save
    assert await stack.rows.conn.fetch("SELECT * FROM ltm_processed_events") == saved_rows
    assert await stack.rows.conn.fetchval("SELECT count(*) FROM server_memories") == memories == 1
    assert (
        await stack.rows.conn.fetchval("SELECT count(*) FROM server_memories WHERE content = $1", ATTACK) == 0
    )

    [letter] = await take_dead_letters(stack.rabbitmq_url, 1)
    assert letter.headers["x-ltm-error-kind"] == DeadLetterKind.EVENT_CONFLICT
    assert json.loads(letter.body)["shard_id"] == 7

    conflicts = [line for line in worker.lines() if line.get("event") == "event id conflict"]
    assert len(conflicts) == 2
    for line in conflicts:
        assert line["level"] == "warning"
        assert (line["shard_id"], line["stored_shard_id"]) == (7, 5)
        text = json.dumps(line)
        for content in (SECRET, ATTACK, VICTIM_GUILD, VICTIM_CHANNEL, victim["tool_call_id"]):
            assert content not in text
    # the invalidation went out for the save and its re-emits only, under the opaque id
    assert {json.dumps(m, sort_keys=True) for m in redis.of(event_id)} == {
        json.dumps(
            {
                "invalidation_id": invalidation_key(event_id),
                "kind": "tomori_state",
                "schema_version": 1,
                "server_disc_id": VICTIM_GUILD,
            },
            sort_keys=True,
        )
    }
