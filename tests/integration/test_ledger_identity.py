"""The ledger answers only its own event (real Postgres, real Redis; security review 3, section 4).

A repeated ``event_id`` is answered from the stored outcome only when the event is the same one (its digest,
``worker/service/digest.py``); another event under that id gets the conflict refusal, which names nothing of
the stored event, and writes nothing. Rows from before migration 0006 (no digest) are matched by the rule of
``same_event``; their invalidations still reach Redis without the event id.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import asyncpg
import orjson
import pytest
import redis.asyncio as aioredis

from contracts.models import Status, ToolCallEvent, invalidation_id
from tests.factories import CHANNEL, GUILD, BotRows, event_body, published
from tests.schemas import assert_conforms
from worker.config import Limits
from worker.invalidation.outbox import InvalidationOutbox
from worker.invalidation.redis import InvalidationPublisher
from worker.pipeline.outcome import EVENT_CONFLICT_REASON
from worker.service.process import ProcessedEvent, process_batch, process_event

pytestmark = pytest.mark.integration

VICTIM_GUILD = "1150000000000000777"
VICTIM_CHANNEL = "1150000000000000778"
SECRET = "VICTIM-PRIVATE: the door code is 4711"


def parse(body: dict[str, Any]) -> ToolCallEvent:
    """The event as the worker reads it off the wire."""
    return ToolCallEvent.model_validate_json(json.dumps(body))


async def ledger(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    rows = await conn.fetch("SELECT * FROM ltm_processed_events ORDER BY event_id")
    return [dict(row) for row in rows]


async def counts(conn: asyncpg.Connection) -> tuple[int, int, int]:
    return (
        await conn.fetchval("SELECT count(*) FROM server_memories"),
        await conn.fetchval("SELECT count(*) FROM personal_memories"),
        await conn.fetchval("SELECT count(*) FROM ltm_processed_events"),
    )


async def victim_and_attacker(rows: BotRows) -> tuple[Any, Any]:
    """Shard 5 saves a secret in its guild; shard 7's bot has a guild of its own (its world)."""
    victim_server = await rows.server(VICTIM_GUILD)
    victim_persona, _ = await rows.persona(victim_server)
    attacker = await rows.world()
    body = event_body({"memory_content": SECRET, "memory_scope": "server_wide"}, persona_id=victim_persona)
    body["shard_id"] = 5
    body["context"]["guild_disc_id"] = VICTIM_GUILD
    body["context"]["channel_disc_id"] = VICTIM_CHANNEL
    return body, attacker


def assert_refused(done: ProcessedEvent, attacker_body: dict[str, Any], victim_body: dict[str, Any]) -> None:
    """The conflict refusal: the attacker's own ids, the internal-error answer, nothing of the victim."""
    result = published(done.result)
    assert_conforms("tool_result.v1.json", result)
    assert done.conflict is not None
    assert done.conflict.stored_shard_id == victim_body["shard_id"]
    assert result == {
        "schema_version": 1,
        "event_id": attacker_body["event_id"],
        "tool_call_id": attacker_body["tool_call_id"],
        "tool_name": attacker_body["tool_name"],
        "success": False,
        "status": Status.INTERNAL_ERROR,
        "message": None,
        "error": "Internal bot error: the memory could not be processed",
        "data": {"status": Status.INTERNAL_ERROR, "reason": EVENT_CONFLICT_REASON},
        "processed_at": result["processed_at"],
        "replayed": False,
    }
    assert done.notification is None
    assert done.invalidation is None
    assert done.replayed is False
    text = json.dumps(result)
    secrets = [SECRET, VICTIM_GUILD, VICTIM_CHANNEL]
    if victim_body["tool_call_id"] != attacker_body["tool_call_id"]:  # (a copy echoes its own, the same)
        secrets.append(victim_body["tool_call_id"])
    for secret in secrets:
        assert secret not in text


async def test_another_shard_reusing_an_event_id_is_refused_and_writes_nothing(
    pool: asyncpg.Pool, rows: BotRows
) -> None:
    victim_body, attacker = await victim_and_attacker(rows)
    victim = parse(victim_body)
    saved = await process_event(pool, victim, Limits())
    assert saved.status == Status.SAVED
    before = await ledger(rows.conn)
    memories = await counts(rows.conn)

    # the review's attack: shard 7 read the id off the invalidation channel and sends its own event with it
    attacker_body = event_body(
        {"memory_content": "anything", "memory_scope": "server_wide"},
        persona_id=attacker.persona_id,
        event_id=victim_body["event_id"],
        shard_id=7,
    )
    done = await process_event(pool, parse(attacker_body), Limits())

    assert_refused(done, attacker_body, victim_body)
    assert await ledger(rows.conn) == before  # nothing written, the victim's row untouched
    assert await counts(rows.conn) == memories


@pytest.mark.parametrize(
    "change",
    [
        {"tool_call_id": "call_other"},  # another tool call of the same shard
        {"shard_id": 7},  # the victim's body verbatim from another shard
        {"arguments": {"memory_content": "guess", "memory_scope": "server_wide"}},  # same ids, other content
        {"context": {"channel_disc_id": CHANNEL}},  # the same call, claimed for another channel
    ],
    ids=["tool_call_id", "shard_id", "arguments", "channel"],
)
async def test_any_difference_in_what_the_event_says_is_a_conflict(
    pool: asyncpg.Pool, rows: BotRows, change: dict[str, Any]
) -> None:
    victim_body, _ = await victim_and_attacker(rows)
    await process_event(pool, parse(victim_body), Limits())
    before = await ledger(rows.conn)
    other = json.loads(json.dumps(victim_body))
    for key, value in change.items():
        if key == "context":
            other["context"].update(value)
        else:
            other[key] = value
    done = await process_event(pool, parse(other), Limits())
    assert_refused(done, other, victim_body)
    assert await ledger(rows.conn) == before


async def test_a_genuine_redelivery_is_answered_from_the_ledger(pool: asyncpg.Pool, rows: BotRows) -> None:
    victim_body, _ = await victim_and_attacker(rows)
    first = await process_event(pool, parse(victim_body), Limits())
    # the same bytes again (a broker redelivery, a retry copy, a dead-letter replay)
    again = await process_event(pool, parse(victim_body), Limits())
    # and the same tool call re-sent by its shard: stamped anew, its member list rebuilt, keys reordered
    resent = json.loads(json.dumps(victim_body, sort_keys=True))
    resent["issued_at"] = "2026-12-02T09:00:00+01:00"
    resent["context"]["guild_members"] = [
        {"user_disc_id": "1150000000000000201", "username": "sparrow_ow", "global_name": None}
    ]
    third = await process_event(pool, parse(resent), Limits())
    for answer in (again, third):
        assert answer.conflict is None
        assert answer.replayed is True
        assert answer.result.model_copy(update={"replayed": False}) == first.result
        assert answer.notification == first.notification
        assert answer.invalidation == first.invalidation
    assert await counts(rows.conn) == (1, 0, 1)


async def test_a_failure_outcome_is_guarded_too(pool: asyncpg.Pool, rows: BotRows) -> None:
    """An outcome that saved nothing (here: self-teaching off) is stored with its digest as well."""
    world = await rows.world(self_teaching=False)
    body = event_body({"memory_content": "x", "memory_scope": "server_wide"}, persona_id=world.persona_id)
    first = await process_event(pool, parse(body), Limits())
    assert first.status == Status.DISABLED
    assert await rows.conn.fetchval("SELECT length(event_digest) FROM ltm_processed_events") == 32
    other = {**body, "arguments": {"memory_content": "y", "memory_scope": "server_wide"}}
    refused = await process_event(pool, parse(other), Limits())
    assert refused.conflict is not None
    again = await process_event(pool, parse(body), Limits())
    assert again.replayed is True
    assert again.status == Status.DISABLED


async def test_two_events_under_one_id_in_one_batch(pool: asyncpg.Pool, rows: BotRows) -> None:
    """The conflict found at the claim (both read the ledger before either wrote): one saves, the other is
    refused, whichever order the batch applies them in."""
    world = await rows.world()
    shared = str(uuid.uuid4())
    bodies = [
        event_body(
            {"memory_content": f"fact {n}", "memory_scope": "server_wide"},
            persona_id=world.persona_id,
            event_id=shared,
            shard_id=n,
        )
        for n in (1, 2)
    ]
    answers = await process_batch(pool, [(parse(b), 1) for b in bodies], Limits())
    assert sorted(a.conflict is None for a in answers) == [False, True]
    kept = next(k for k, a in enumerate(answers) if a.conflict is None)
    refused = answers[1 - kept]
    assert answers[kept].status == Status.SAVED
    assert refused.conflict is not None
    assert refused.conflict.stored_shard_id == bodies[kept]["shard_id"]
    assert_refused(refused, bodies[1 - kept], bodies[kept])
    assert await counts(rows.conn) == (1, 0, 1)
    assert f"fact {kept + 1}" == await rows.conn.fetchval("SELECT content FROM server_memories")
    assert f"fact {kept + 1}" not in json.dumps(published(refused.result))


async def test_concurrent_events_under_one_id_from_two_shards(pool: asyncpg.Pool, rows: BotRows) -> None:
    """Separate transactions racing for the claim: exactly one saves, the other is refused, every time."""
    world = await rows.world()
    for _ in range(10):
        shared = str(uuid.uuid4())
        bodies = [
            event_body(
                {"memory_content": f"fact {n} {shared}", "memory_scope": "server_wide"},
                persona_id=world.persona_id,
                event_id=shared,
                shard_id=n,
            )
            for n in (1, 2)
        ]
        answers = await asyncio.gather(*(process_event(pool, parse(b), Limits()) for b in bodies))
        assert sorted(a.conflict is None for a in answers) == [False, True]
    assert await counts(rows.conn) == (10, 0, 10)


# --- rows written before migration 0006 (no digest) ---------------------------------------------------


async def make_legacy(conn: asyncpg.Connection, event_id: str) -> None:
    """The row as a worker of the previous version wrote it: no digest, the invalidation with event_id."""
    await conn.execute(
        "UPDATE ltm_processed_events SET event_digest = NULL,"
        " invalidation = CASE WHEN invalidation IS NULL THEN NULL"
        " ELSE (invalidation - 'invalidation_id') || jsonb_build_object('event_id', event_id::text) END"
        " WHERE event_id = $1",
        uuid.UUID(event_id),
    )


async def test_a_legacy_row_answers_its_own_event_and_refuses_others(
    pool: asyncpg.Pool, rows: BotRows
) -> None:
    victim_body, attacker = await victim_and_attacker(rows)
    first = await process_event(pool, parse(victim_body), Limits())
    await make_legacy(rows.conn, victim_body["event_id"])
    before = await ledger(rows.conn)
    assert before[0]["event_digest"] is None

    # the event from before the upgrade, redelivered or replayed: still answered
    again = await process_event(pool, parse(victim_body), Limits())
    assert again.replayed is True
    assert again.conflict is None
    assert again.result.model_copy(update={"replayed": False}) == first.result
    assert again.notification == first.notification

    # the review's attack on a legacy row: only the event id is known
    attacker_body = event_body(
        {"memory_content": "anything", "memory_scope": "server_wide"},
        persona_id=attacker.persona_id,
        event_id=victim_body["event_id"],
        shard_id=7,
    )
    refused = await process_event(pool, parse(attacker_body), Limits())
    assert_refused(refused, attacker_body, victim_body)
    # even with the victim's tool call id and shard, another channel does not match the stored notice
    moved = json.loads(json.dumps(victim_body))
    moved["context"]["guild_disc_id"] = GUILD
    moved["context"]["channel_disc_id"] = CHANNEL
    assert_refused(await process_event(pool, parse(moved), Limits()), moved, victim_body)
    assert await ledger(rows.conn) == before


async def test_a_legacy_invalidation_reaches_redis_without_its_event_id(
    pool: asyncpg.Pool, rows: BotRows, redis_url: str
) -> None:
    """A replayed legacy row's invalidation, and a legacy row left pending in the outbox, are published in
    the contract's form: the opaque invalidation_id, never the event_id."""
    world = await rows.world()
    bodies = [
        event_body(
            {"memory_content": f"fact {n}", "memory_scope": "server_wide"}, persona_id=world.persona_id
        )
        for n in range(2)
    ]
    for body in bodies:
        await process_event(pool, parse(body), Limits())
        await make_legacy(rows.conn, body["event_id"])
    replayed = await process_event(pool, parse(bodies[0]), Limits())
    assert replayed.invalidation is not None
    assert replayed.invalidation["event_id"] == bodies[0]["event_id"]  # as the ledger holds it
    await rows.conn.execute(
        "UPDATE ltm_processed_events SET invalidation_pending_since = now() WHERE event_id = $1",
        uuid.UUID(bodies[1]["event_id"]),
    )

    channel = f"ltm-test-{uuid.uuid4().hex}"
    cache = InvalidationPublisher(redis_url, channel)
    outbox = InvalidationOutbox(pool, cache, sweep_seconds=0.2)
    client = aioredis.Redis.from_url(redis_url)
    pubsub = client.pubsub()
    await pubsub.subscribe(channel)
    received: list[dict[str, Any]] = []
    try:
        await outbox.publish(replayed.result.event_id, replayed.invalidation)  # the re-emit
        outbox.start()  # the sweep publishes the pending legacy row
        deadline = asyncio.get_running_loop().time() + 30
        while len(received) < 2:
            assert asyncio.get_running_loop().time() < deadline, f"got {received}"
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
            if message is not None:
                received.append(orjson.loads(message["data"]))
    finally:
        await outbox.close()
        await pubsub.aclose()
        await client.aclose()
        await cache.close()
    expected = [
        {
            "schema_version": 1,
            "invalidation_id": invalidation_id(uuid.UUID(body["event_id"])),
            "kind": "tomori_state",
            "server_disc_id": GUILD,
        }
        for body in bodies
    ]
    assert received == expected
    for message in received:
        assert_conforms("cache_invalidation.v1.json", message)
