"""Security review 5, N-C: an identity laundered through a broker dead letter and ``worker dlq replay``.

The review's reproduction, on real users of the test's vhost: with no worker running, shard 0's own user
publishes two events naming shard 1, one with its own ``user_id`` and a forged ``x-ltm-user-id`` naming
shard 1's user, one with neither; a client requeues them until the broker dead-letters them
(``delivery_limit``, x-death). A worker then runs with ``LTM_SHARD_IDENTITY=required`` and the operator
replays them. Before, ``dlq show`` printed the forged header as "published by", the replay carried it, and
both were saved for shard 1. Now the letter's sender is what the worker or RabbitMQ vouches for
(worker/broker/published_by.py ``published_by``): shard 0's user (refused by the worker, answered to shard 0),
and unknown (not replayed, unless the operator vouches for it with ``--as-trusted-publisher``, on record).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import pytest
import structlog

from contracts.models import DeadLetterKind, Status
from tests.factories import BotRows, event_body
from tests.services import Services
from tests.support.harness import queue_depth
from tests.support.users import Grants, Users, rabbitmq_users
from tests.support.wait import eventually
from worker.broker.headers import USER_ID
from worker.broker.topology import DEFAULT_DELIVERY_LIMIT, declare_topology
from worker.config import Settings, Topology
from worker.runner import Worker
from worker.service.policy import RetryPolicy
from worker.testing.dead_letters import keep_copies

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TOPOLOGY = Topology()
WAIT = 120.0
SAVE = {"memory_content": "{user} LAUNDER likes dogs", "memory_scope": "server_wide"}


@pytest.fixture
async def users(test_services: Services, rabbitmq_url: str) -> AsyncIterator[Users]:
    """shard 0's own user (a shard's grants) and an operator (a trusted publisher)."""
    async with rabbitmq_users(
        test_services, rabbitmq_url, {"shard-0": Grants.shard(0), "operator": Grants()}
    ) as made:
        yield made


@pytest.fixture
def captured() -> Iterator[list[MutableMapping[str, Any]]]:
    with structlog.testing.capture_logs() as log:
        yield log


@dataclass
class Ran:
    code: int
    out: str
    err: str


async def dlq(*args: str, url: str, dsn: str, users: Users) -> Ran:
    """``python -m worker dlq ARGS`` as the operator, with the workers' identity settings; the dead letters'
    copies kept first, as a running worker keeps them."""
    await keep_copies(url, dsn)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LTM_", "MAX_"))}
    env.update(
        LTM_RABBITMQ_URL=url,
        LTM_POSTGRES_DSN=dsn,
        LTM_SHARD_IDENTITY="required",
        LTM_SHARD_USER=f"{users.prefix}-shard-{{shard_id}}",
        LTM_TRUSTED_PUBLISHERS=users.name("operator"),
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "worker", "dlq", *args),
        cwd=REPO,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), WAIT)
    assert process.returncode is not None
    return Ran(process.returncode, out.decode(), err.decode())


async def results(url: str, shard_id: int) -> list[dict[str, Any]]:
    """What shard ``shard_id``'s results queue holds (taken)."""
    connection = await aio_pika.connect(url)
    try:
        queue = await (await connection.channel()).get_queue(f"tomori.shard.{shard_id}.results", ensure=False)
        taken = []
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            taken.append(json.loads(message.body))
        return taken
    finally:
        await connection.close()


async def test_a_forged_sender_dead_lettered_by_the_broker_is_not_laundered_by_a_replay(
    users: Users,
    rabbitmq_url: str,
    migrated_dsn: str,
    redis_url: str,
    captured: list[MutableMapping[str, Any]],
) -> None:
    shard0, shard1 = users.name("shard-0"), users.name("shard-1")  # shard 1's user need not exist
    operator_url = users.url("operator")
    conn = await asyncpg.connect(migrated_dsn)
    try:
        persona_id = (await BotRows(conn).world()).persona_id
    finally:
        await conn.close()
    settings = Settings(
        postgres_dsn=migrated_dsn,
        rabbitmq_url=rabbitmq_url,
        redis_url=redis_url,
        http_port=0,
        shard_identity="required",
        shard_user=f"{users.prefix}-shard-{{shard_id}}",
        trusted_publishers=users.name("operator"),
    )

    # the topology as the definitions file makes it before any worker runs, and both shards' results queues
    admin = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await admin.channel()
        declared = await declare_topology(channel, TOPOLOGY, RetryPolicy.of(settings).tiers())
        for shard_id in (0, 1):
            queue = await channel.declare_queue(f"tomori.shard.{shard_id}.results", durable=True)
            await queue.bind(declared.results, f"shard.{shard_id}")

        # shard 0 publishes, as its own user, two events naming shard 1
        forged = event_body(SAVE, persona_id=persona_id, shard_id=1)
        bare = event_body(SAVE, persona_id=persona_id, shard_id=1)
        shard = await aio_pika.connect(users.url("shard-0"))
        try:
            publishing = await shard.channel(publisher_confirms=True, on_return_raises=True)
            exchange = await publishing.get_exchange(TOPOLOGY.tool_calls_exchange, ensure=False)
            sent: list[tuple[dict[str, Any], str | None, dict[str, Any]]] = [
                (forged, shard0, {USER_ID: shard1}),
                (bare, None, {}),
            ]
            for body, user_id, headers in sent:
                message = aio_pika.Message(
                    json.dumps(body).encode(),
                    message_id=body["event_id"],
                    content_type="application/json",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    user_id=user_id,
                    headers=headers,
                )
                await exchange.publish(message, "tool.create_long_term_memory", mandatory=True)
        finally:
            await shard.close()

        # a crash-looping worker, as the review stood it in for: taken and given back past the delivery limit
        taken = 0
        while (delivery := await declared.work_queue.get(fail=False, timeout=5)) is not None:
            await delivery.nack(requeue=True)
            taken += 1
        assert taken == 2 * (DEFAULT_DELIVERY_LIMIT + 1)
    finally:
        await admin.close()
    await eventually(
        lambda: _depth_is(rabbitmq_url, TOPOLOGY.dead_letter_queue, 2), "both dead-lettered by the broker"
    )

    # what show says: what the broker checked, never the forged header as a fact
    shown = await dlq("show", forged["event_id"], url=operator_url, dsn=migrated_dsn, users=users)
    assert shown.code == 0, shown.err
    assert "delivery_limit" in shown.out
    assert (
        f"published by: {shard0} (the message's user_id, checked by RabbitMQ; its x-ltm-user-id "
        f"'{shard1}' is not known to be the worker's, ignored)"
    ) in shown.out
    shown = await dlq("show", bare["event_id"], url=operator_url, dsn=migrated_dsn, users=users)
    assert "published by: unknown (no user_id)" in shown.out

    # a worker in required mode, then the operator's replay of both
    worker = Worker(settings)
    task = asyncio.create_task(worker.run(signals=False))
    try:
        await eventually(
            lambda: any(line["event"] == "consuming" for line in captured), "the worker consumes"
        )
        ids = ("--event-id", forged["event_id"], "--event-id", bare["event_id"])
        replayed = await dlq("replay", *ids, url=operator_url, dsn=migrated_dsn, users=users)
        assert replayed.code == 1, replayed.out + replayed.err
        assert replayed.out == "moved 1, kept 1\n"
        assert f"not replayed: {bare['event_id']}: no known sender (unknown (no user_id))" in replayed.err
        assert "--as-trusted-publisher replays it as your own event" in replayed.err

        # the forged one is refused as shard 0's: answered to shard 0, dead-lettered again by the worker
        answered = await eventually(lambda: results(rabbitmq_url, 0), "shard 0's answer")
        assert [(r["event_id"], r["status"]) for r in answered] == [
            (forged["event_id"], Status.INTERNAL_ERROR)
        ]
        await eventually(
            lambda: _depth_is(rabbitmq_url, TOPOLOGY.dead_letter_queue, 2), "the refusal's letter"
        )
        again = await dlq("show", forged["event_id"], url=operator_url, dsn=migrated_dsn, users=users)
        assert DeadLetterKind.UNVERIFIED_SHARD in again.out
        assert f"published by: {shard0} (recorded by the worker)" in again.out

        # nothing was saved for shard 1, nothing answered to it
        assert await _saved(migrated_dsn, forged["event_id"], bare["event_id"]) == (0, 0)
        assert await results(rabbitmq_url, 1) == []
        operations = await _operations(migrated_dsn)
        assert operations[0]["letters"] == {
            forged["event_id"]: "replayed",
            bare["event_id"]: "not_replayed",
        }
        assert "as_trusted_publisher" not in operations[0]["filters"]

        # the operator vouches for the letter with no known sender: replayed as the operator's own, on record
        vouched = await dlq(
            "replay", "--event-id", bare["event_id"], "--as-trusted-publisher",
            url=operator_url, dsn=migrated_dsn, users=users,
        )  # fmt: skip
        assert (vouched.code, vouched.out) == (0, "moved 1, kept 1\n"), vouched.err
        saved = await eventually(lambda: results(rabbitmq_url, 1), "shard 1's answer to the vouched event")
        assert [(r["event_id"], r["status"]) for r in saved] == [(bare["event_id"], Status.SAVED)]
        latest = (await _operations(migrated_dsn))[0]
        assert latest["filters"]["as_trusted_publisher"] is True
        assert latest["letters"] == {bare["event_id"]: "replayed"}
        assert await _saved(migrated_dsn, forged["event_id"], bare["event_id"]) == (0, 1)
    finally:
        worker.stop()
        assert await asyncio.wait_for(task, WAIT) == 0


async def _depth_is(url: str, queue: str, expected: int) -> bool:
    return await queue_depth(url, queue) == expected


async def _saved(dsn: str, *event_ids: str) -> tuple[int, ...]:
    """How many times each event was written (its row in the ledger)."""
    conn = await asyncpg.connect(dsn)
    try:
        counts = []
        for event_id in event_ids:
            count = await conn.fetchval(
                "SELECT count(*) FROM ltm_processed_events WHERE event_id::text = $1", event_id
            )
            counts.append(int(count))
        return tuple(counts)
    finally:
        await conn.close()


async def _operations(dsn: str) -> list[dict[str, Any]]:
    """The replays on record, newest first: their filters and each letter's outcome."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT operation_id, filters FROM ltm_dlq_operations ORDER BY started_at DESC, operation_id"
        )
        found = []
        for row in rows:
            letters = await conn.fetch(
                "SELECT event_id, outcome FROM ltm_dlq_operation_letters WHERE operation_id = $1",
                row["operation_id"],
            )
            filters = row["filters"]
            found.append(
                {
                    "filters": json.loads(filters) if isinstance(filters, str) else filters,
                    "letters": {letter["event_id"]: letter["outcome"] for letter in letters},
                }
            )
        return found
    finally:
        await conn.close()
