"""Fair shares between shards and shard identity (docs/fair-shares.md, CONTRACT.md section 2), with the
worker's consume loop in the test's event loop on the real Postgres, RabbitMQ and Redis (own database and
vhost per test).

No assertion is on time: a flood's effect on another shard is read from the order the answers come in (the
quiet shard's events are answered while most of the flood is still waiting), and every event of every shard
is answered exactly once and written once.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import aio_pika
import aio_pika.exceptions
import asyncpg
import pytest
import structlog

from contracts.models import DeadLetterKind, Status
from tests.factories import GUILD, BotRows, event_body, member
from tests.services import Services
from tests.support.harness import queue_depth as depth
from tests.support.wait import eventually
from worker.broker.headers import USER_ID
from worker.broker.topology import declare_shard_queue, declare_topology, shard_queue_name
from worker.config import Settings, Topology
from worker.ops.shard_queues import declare_shards, forget_shards
from worker.ops.shards_report import Report, as_json, gather, render
from worker.runner import Worker
from worker.runtime.hand import MARGIN_BYTES
from worker.runtime.shard_queue_set import REFRESH_SECONDS
from worker.service.policy import RetryPolicy
from worker.testing.management import ManagementApi
from worker.testing.workers import free_port

WAIT = 120.0
TOPOLOGY = Topology()
FLOODER, QUIET = 0, 1
SAVE = {"memory_content": "{user} likes dogs", "memory_scope": "server_wide"}


def user_of(url: str) -> str:
    """The RabbitMQ user the test's connections log in as (what the broker lets them put in user_id)."""
    return unquote(urlsplit(url).username or "guest")


@dataclass
class Answers:
    """Every result each shard got, in the order they came."""

    order: list[tuple[int, str]] = field(default_factory=list)
    results: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def count(self, event_id: str) -> int:
        return len(self.results.get(event_id, []))

    def answered(self, ids: list[str]) -> int:
        return sum(1 for i in ids if i in self.results)


@dataclass
class Shards:
    """Shard connections on the test's vhost: each declares and consumes its two queues, and publishes."""

    url: str
    answers: Answers
    connection: aio_pika.abc.AbstractConnection | None = None
    channels: dict[int, aio_pika.abc.AbstractChannel] = field(default_factory=dict)

    async def open(self, *shard_ids: int) -> None:
        if self.connection is None:
            self.connection = await aio_pika.connect(self.url)
        connection = self.connection
        setup = await connection.channel()
        exchanges = {}
        for name in (
            TOPOLOGY.tool_calls_exchange,
            TOPOLOGY.results_exchange,
            TOPOLOGY.notifications_exchange,
        ):
            exchanges[name] = await setup.declare_exchange(name, aio_pika.ExchangeType.TOPIC, durable=True)
        for shard_id in shard_ids:
            results = await setup.declare_queue(f"tomori.shard.{shard_id}.results", durable=True)
            await results.bind(exchanges[TOPOLOGY.results_exchange], f"shard.{shard_id}")
            notices = await setup.declare_queue(f"tomori.shard.{shard_id}.notifications", durable=True)
            await notices.bind(exchanges[TOPOLOGY.notifications_exchange], f"shard.{shard_id}")
            await results.consume(self._collect(shard_id), no_ack=True)
            self.channels[shard_id] = await connection.channel(publisher_confirms=True, on_return_raises=True)

    def _collect(self, shard_id: int) -> Callable[[aio_pika.abc.AbstractIncomingMessage], Any]:
        async def collect(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            body = json.loads(message.body)
            self.answers.order.append((shard_id, body["event_id"]))
            self.answers.results.setdefault(body["event_id"], []).append(body)

        return collect

    async def publish(
        self,
        shard_id: int,
        body: dict[str, Any],
        *,
        key: str = "tool.create_long_term_memory",
        user_id: str | None = None,
        headers: dict[str, Any] | None = None,
    ) -> None:
        channel = self.channels[shard_id]
        exchange = await channel.get_exchange(TOPOLOGY.tool_calls_exchange, ensure=False)
        message = aio_pika.Message(
            json.dumps(body).encode(),
            message_id=body["event_id"],
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            user_id=user_id,
            headers=headers or {},
        )
        await exchange.publish(message, key, mandatory=True)

    async def close(self) -> None:
        if self.connection is not None:
            await self.connection.close()


@dataclass
class Running:
    settings: Settings
    log: list[dict[str, Any]]
    workers: list[tuple[Worker, asyncio.Task[int]]] = field(default_factory=list)

    def count(self, event: str) -> int:
        return sum(1 for line in self.log if line.get("event") == event)

    async def start(self, **overrides: Any) -> Worker:
        consuming = self.count("consuming")
        worker = Worker(self.settings.model_copy(update=overrides))
        self.workers.append((worker, asyncio.create_task(worker.run(signals=False))))
        await eventually(lambda: self.count("consuming") > consuming, "the worker consumes")
        return worker


@pytest.fixture
def captured() -> Iterator[list[dict[str, Any]]]:
    with structlog.testing.capture_logs() as log:
        yield log


@pytest.fixture
async def world(migrated_dsn: str) -> tuple[str, int]:
    conn = await asyncpg.connect(migrated_dsn)
    try:
        rows = BotRows(conn)
        seeded = await rows.world()
    finally:
        await conn.close()
    return migrated_dsn, seeded.persona_id


@pytest.fixture
async def running(
    world: tuple[str, int], rabbitmq_url: str, redis_url: str, captured: list[dict[str, Any]]
) -> AsyncIterator[Running]:
    dsn, _ = world
    settings = Settings(
        postgres_dsn=dsn,
        rabbitmq_url=rabbitmq_url,
        redis_url=redis_url,
        http_port=0,
        shutdown_grace_seconds=int(WAIT),
        limits={"max_server_memories": 100_000_000},
    )
    running = Running(settings, captured)
    try:
        yield running
    finally:
        for worker, _ in running.workers:
            worker.stop()
        for _, task in running.workers:
            try:
                await asyncio.wait_for(task, WAIT)
            except BaseException:
                task.cancel()


@pytest.fixture
async def shards(rabbitmq_url: str) -> AsyncIterator[Shards]:
    shards = Shards(rabbitmq_url, Answers())
    await shards.open(FLOODER, QUIET, 5)
    try:
        yield shards
    finally:
        await shards.close()


async def ledger(dsn: str) -> Counter[str]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT event_id::text FROM ltm_processed_events")
        return Counter(row["event_id"] for row in rows)
    finally:
        await conn.close()


async def seed_guilds(dsn: str, guilds: list[str]) -> dict[str, int]:
    """A server and its persona for each of ``guilds`` (beside the world's): guild -> persona id."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = BotRows(conn)
        return {guild: (await rows.persona(await rows.server(guild)))[0] for guild in guilds}
    finally:
        await conn.close()


async def flood(
    shards: Shards, persona_id: int, count: int, *, guilds: dict[str, int] | None = None, **publish: Any
) -> list[str]:
    """``count`` events of the flooding shard, as fast as the broker confirms them (500 in flight), in turn
    from ``guilds`` (guild -> its persona; the world's guild when not given)."""
    chosen = list((guilds or {GUILD: persona_id}).items())
    bodies = [
        event_body(
            SAVE, persona_id=chosen[n % len(chosen)][1], shard_id=FLOODER, guild=chosen[n % len(chosen)][0]
        )
        for n in range(count)
    ]
    for start in range(0, count, 500):
        await asyncio.gather(*(shards.publish(FLOODER, b, **publish) for b in bodies[start : start + 500]))
    return [b["event_id"] for b in bodies]


async def assert_quiet_shard_overtakes(
    shards: Shards,
    persona_id: int,
    flood_ids: list[str],
    *,
    trickle: int = 5,
    waiting: int = 2,
    shard_id: int = QUIET,
    guild: str = GUILD,
) -> list[str]:
    """The quiet shard's (or guild's) events, sent after the whole flood is in the broker, are each answered
    while at least 1/``waiting`` of the flood still waits for its answer."""
    quiet_ids = []
    for _ in range(trickle):
        body = event_body(SAVE, persona_id=persona_id, shard_id=shard_id, guild=guild)
        quiet_ids.append(body["event_id"])
        await shards.publish(shard_id, body)
        await eventually(lambda i=body["event_id"]: i in shards.answers.results, "the quiet shard's answer")
        left = len(flood_ids) - shards.answers.answered(flood_ids)
        assert left >= len(flood_ids) // waiting, (
            f"the quiet shard's event was answered after {len(flood_ids) - left} of the flood's "
            f"{len(flood_ids)}: it waited behind the flood"
        )
    return quiet_ids


@pytest.mark.slow
async def test_a_flood_of_one_shard_does_not_hold_up_another_shards_events(
    running: Running, shards: Shards, world: tuple[str, int]
) -> None:
    """Shard 0 puts 3,000 events on the common queue (contract version 1: no user_id, the shard only in the
    body) before shard 1 sends one at a time: shard 1 is served in its turn, not after the flood."""
    dsn, persona_id = world
    await declare(running.settings)  # the work queue exists before any worker runs (definitions.json)
    flood_ids = await flood(shards, persona_id, 3000)
    await running.start()
    quiet_ids = await assert_quiet_shard_overtakes(shards, persona_id, flood_ids)
    everything = [*flood_ids, *quiet_ids]
    await eventually(lambda: shards.answers.answered(everything) == len(everything), "every event answered")
    assert {shards.answers.count(i) for i in everything} == {1}, "an event answered twice"
    assert all(shards.answers.results[i][0]["status"] == Status.SAVED for i in everything)
    written = await ledger(dsn)
    assert set(written) == set(everything), "an event not written, or one written that was not sent"
    assert set(written.values()) == {1}, "an event written twice"


QUIET_GUILD = "1150000000000000555"


def assert_all_saved_once(shards: Shards, written: Counter[str], everything: list[str]) -> None:
    assert {shards.answers.count(i) for i in everything} == {1}, "an event answered twice"
    assert all(shards.answers.results[i][0]["status"] == Status.SAVED for i in everything)
    assert set(written) == set(everything), "an event not written, or one written that was not sent"
    assert set(written.values()) == {1}, "an event written twice"


@pytest.mark.slow
async def test_a_guilds_flood_does_not_hold_up_another_guild_of_its_shard(
    running: Running, shards: Shards, world: tuple[str, int]
) -> None:
    """One guild of shard 0 puts 2,000 events on the common queue before another guild of shard 0 sends one at
    a time: the quiet guild is served in its turn inside its shard, not after its shard's flood."""
    dsn, persona_id = world
    quiet_persona = (await seed_guilds(dsn, [QUIET_GUILD]))[QUIET_GUILD]
    await declare(running.settings)
    flood_ids = await flood(shards, persona_id, 2000)
    await running.start()
    quiet_ids = await assert_quiet_shard_overtakes(
        shards, quiet_persona, flood_ids, shard_id=FLOODER, guild=QUIET_GUILD
    )
    everything = [*flood_ids, *quiet_ids]
    await eventually(lambda: shards.answers.answered(everything) == len(everything), "every event answered")
    assert_all_saved_once(shards, await ledger(dsn), everything)


@pytest.mark.slow
async def test_a_flood_spread_over_many_guilds_of_a_shard_beside_one_quiet_guild(
    running: Running, shards: Shards, world: tuple[str, int]
) -> None:
    """The sybil case: shard 0's 2,000 events come from 200 guilds in turn; a quiet guild of shard 0 waits at
    most one event of each of them a turn (no scheduler can tell 200 loud guilds from 200 quiet ones), so its
    event is still answered while a quarter of the flood waits; every event of both is answered and written
    once."""
    dsn, persona_id = world
    guilds = await seed_guilds(dsn, [QUIET_GUILD, *(str(1150000000000010000 + n) for n in range(200))])
    quiet_persona = guilds.pop(QUIET_GUILD)
    await declare(running.settings)
    flood_ids = await flood(shards, persona_id, 2000, guilds=guilds)
    await running.start()
    quiet_ids = await assert_quiet_shard_overtakes(
        shards, quiet_persona, flood_ids, trickle=1, waiting=4, shard_id=FLOODER, guild=QUIET_GUILD
    )
    everything = [*flood_ids, *quiet_ids]
    await eventually(lambda: shards.answers.answered(everything) == len(everything), "every event answered")
    assert_all_saved_once(shards, await ledger(dsn), everything)


@pytest.mark.slow
async def test_a_shard_over_its_share_waits_in_its_own_queue_and_nothing_is_lost(
    running: Running, shards: Shards, world: tuple[str, int], rabbitmq_url: str
) -> None:
    """With a prefetch window of 100 (and 4 events at a time, so that the flood lasts), the worker moves what
    the flooding shard holds past its share to ltm.create_memory.shard.0 and the common queue empties: the
    quiet shard's events, sent then, are served in their turn while most of the flood still waits in the
    shard's own queue; every event of both is answered once and written once, and every queue ends empty.

    (An event sent while the common queue still holds a flood waits until the worker has moved what is ahead
    of it: docs/fair-shares.md gives how fast that goes.)"""
    dsn, persona_id = world
    warm = event_body(SAVE, persona_id=persona_id, shard_id=FLOODER)  # the shard's own queue is declared
    await running.start(prefetch=100, concurrency=4)
    await shards.publish(FLOODER, warm)
    await eventually(lambda: warm["event_id"] in shards.answers.results, "the first event's answer")
    await eventually(
        lambda: declared(rabbitmq_url, shard_queue_name(TOPOLOGY, FLOODER)), "shard 0's own queue"
    )
    flood_ids = await flood(shards, persona_id, 1500)
    await eventually(lambda: depth_is(rabbitmq_url, TOPOLOGY.work_queue, 0), "the common queue moved or held")
    quiet_ids = await assert_quiet_shard_overtakes(shards, persona_id, flood_ids, trickle=3)
    everything = [warm["event_id"], *flood_ids, *quiet_ids]
    await eventually(lambda: shards.answers.answered(everything) == len(everything), "every event answered")
    assert {shards.answers.count(i) for i in everything} == {1}
    written = await ledger(dsn)
    assert set(written) == set(everything), "an event not written, or one written that was not sent"
    assert set(written.values()) == {1}, "an event written twice"
    worker = running.workers[0][0]
    moved = worker_metric(worker, "ltm_shard_events_moved_total", shard="0")
    assert moved > 0, "nothing was moved to the shard's own queue"
    for queue in (TOPOLOGY.work_queue, shard_queue_name(TOPOLOGY, FLOODER)):
        assert await depth(rabbitmq_url, queue) == 0, f"{queue} still holds events"


async def depth_is(url: str, queue: str, expected: int) -> bool:
    return await depth(url, queue) == expected


async def declare(settings: Settings) -> None:
    connection = await aio_pika.connect(settings.rabbitmq_url)
    try:
        await declare_topology(await connection.channel(), TOPOLOGY, RetryPolicy.of(settings).tiers())
    finally:
        await connection.close()


def worker_metric(worker: Worker, name: str, **labels: str) -> float:
    """A sample of the running worker's metrics registry."""
    consumer = worker._consumer  # the current connection's consumer holds the services' metrics
    assert consumer is not None
    registry = consumer._services.metrics.registry
    value = registry.get_sample_value(name, labels)
    return float(value or 0.0)


async def test_a_shard_with_its_own_routing_key_goes_straight_to_its_own_queue(
    running: Running, shards: Shards, world: tuple[str, int], rabbitmq_url: str
) -> None:
    """Before the worker has seen shard 0 its own key is unroutable (a return, nothing enqueued); once it
    has, an event published with tool.create_long_term_memory.shard.0 lands in ltm.create_memory.shard.0
    and is answered."""
    _, persona_id = world
    await running.start()
    own_key = "tool.create_long_term_memory.shard.0"
    early = event_body(SAVE, persona_id=persona_id, shard_id=FLOODER)
    with pytest.raises(aio_pika.exceptions.DeliveryError):
        await shards.publish(FLOODER, early, key=own_key)
    await shards.publish(FLOODER, early)  # the version-1 key: the worker sees the shard
    await eventually(lambda: early["event_id"] in shards.answers.results, "the first event's answer")

    async def routed() -> bool:
        try:
            await depth(rabbitmq_url, shard_queue_name(TOPOLOGY, FLOODER))
        except aio_pika.exceptions.ChannelClosed:
            return False
        return True

    await eventually(routed, "shard 0's own queue is declared")
    later = event_body(SAVE, persona_id=persona_id, shard_id=FLOODER)
    await eventually(lambda: running.count("consuming") >= 1, "consuming")
    await asyncio.sleep(0)  # the binding is made before the queue is consumed: routed now
    await shards.publish(FLOODER, later, key=own_key)
    await eventually(lambda: later["event_id"] in shards.answers.results, "the own-key event's answer")
    assert shards.answers.results[later["event_id"]][0]["status"] == Status.SAVED


# --- identity ------------------------------------------------------------------------------------------


async def dead_letters(url: str, expected: int) -> list[aio_pika.abc.AbstractIncomingMessage]:
    connection = await aio_pika.connect(url)
    found: list[aio_pika.abc.AbstractIncomingMessage] = []
    try:
        channel = await connection.channel()
        dlq = await channel.declare_queue(TOPOLOGY.dead_letter_queue, passive=True)

        async def take() -> bool:
            while True:
                message = await dlq.get(fail=False, no_ack=True)
                if message is None:
                    return len(found) >= expected
                found.append(message)

        await eventually(take, f"{expected} dead letter(s)")
        return found
    finally:
        await connection.close()


async def test_checked_refuses_one_shards_user_speaking_for_another_before_anything_is_written(
    running: Running, shards: Shards, world: tuple[str, int], rabbitmq_url: str
) -> None:
    """checked (the default): an event sent as shard-5 (recorded on a trusted publisher's copy, as a replay of
    a letter carries it) naming shard 1 is dead-lettered as unverified_shard with its sender recorded and
    answered to shard 5, never to shard 1; nothing is written. An event whose user is no shard's (here the
    test's own) is saved, as contract version 1 allowed."""
    dsn, persona_id = world
    user = user_of(rabbitmq_url)
    first = await running.start(trusted_publishers=user)
    forged = event_body(SAVE, persona_id=persona_id, shard_id=QUIET)
    await shards.publish(QUIET, forged, user_id=user, headers={USER_ID: "shard-5"})
    [letter] = await dead_letters(rabbitmq_url, 1)
    headers = letter.headers or {}
    assert headers["x-ltm-error-kind"] == DeadLetterKind.UNVERIFIED_SHARD
    assert "'shard-5' may not speak for shard 1" in str(headers["x-ltm-error"])
    assert headers[USER_ID] == "shard-5"
    await eventually(lambda: forged["event_id"] in shards.answers.results, "the refusal's answer")
    assert shards.answers.order == [(5, forged["event_id"])], "the refusal went elsewhere than to shard 5"
    assert shards.answers.results[forged["event_id"]][0]["status"] == Status.INTERNAL_ERROR
    assert forged["event_id"] not in await ledger(dsn)

    # a user that is no shard's (and not trusted either): accepted in checked mode
    first.stop()
    assert await running.workers.pop()[1] == 0
    await running.start(trusted_publishers="operator")
    plain = event_body(SAVE, persona_id=persona_id, shard_id=QUIET)
    await shards.publish(QUIET, plain, user_id=user)
    await eventually(lambda: plain["event_id"] in shards.answers.results, "the plain event's answer")
    assert shards.answers.results[plain["event_id"]][0]["status"] == Status.SAVED


async def test_required_identity_refuses_an_event_without_user_id_and_shared_accepts_any(
    running: Running, shards: Shards, world: tuple[str, int], rabbitmq_url: str
) -> None:
    """required: an event with no user_id, and one whose user is neither shard 1's nor trusted, are refused
    (no answer: neither sender is a shard); shared: the same events are saved."""
    dsn, persona_id = world
    strict = await running.start(shard_identity="required")
    bare = event_body(SAVE, persona_id=persona_id, shard_id=QUIET)
    stranger = event_body(SAVE, persona_id=persona_id, shard_id=QUIET)
    await shards.publish(QUIET, bare)
    await shards.publish(QUIET, stranger, user_id=user_of(rabbitmq_url))
    letters = await dead_letters(rabbitmq_url, 2)
    assert {(m.headers or {})["x-ltm-error-kind"] for m in letters} == {DeadLetterKind.UNVERIFIED_SHARD}
    assert sorted((m.headers or {})[USER_ID] for m in letters) == sorted(["", user_of(rabbitmq_url)])
    strict.stop()
    await running.workers[0][1]
    await running.start(shard_identity="shared")
    again = event_body(SAVE, persona_id=persona_id, shard_id=QUIET)
    other = event_body(SAVE, persona_id=persona_id, shard_id=QUIET)
    await shards.publish(QUIET, again)
    await shards.publish(QUIET, other, user_id=user_of(rabbitmq_url))
    await eventually(
        lambda: shards.answers.answered([again["event_id"], other["event_id"]]) == 2, "both answered"
    )
    assert {shards.answers.results[i][0]["status"] for i in (again["event_id"], other["event_id"])} == {
        Status.SAVED
    }
    written = await ledger(dsn)
    assert bare["event_id"] not in written
    assert stranger["event_id"] not in written
    assert bare["event_id"] not in shards.answers.results


async def test_a_trusted_publisher_speaks_for_the_sender_recorded_on_the_letter(
    running: Running, shards: Shards, world: tuple[str, int], rabbitmq_url: str
) -> None:
    """A replay (a trusted user, here the test's) is checked against the sender recorded in x-ltm-user-id:
    shard-1 may speak for shard 1, shard-5 may not (and its answer goes to shard 5, the sender's own); a
    trusted user's own event with no record may speak for any shard."""
    dsn, persona_id = world
    user = user_of(rabbitmq_url)
    await running.start(trusted_publishers=user, shard_identity="required")
    own = event_body(SAVE, persona_id=persona_id, shard_id=QUIET)
    forged = event_body(SAVE, persona_id=persona_id, shard_id=QUIET)
    operators = event_body(SAVE, persona_id=persona_id, shard_id=QUIET)
    await shards.publish(QUIET, own, user_id=user, headers={USER_ID: "shard-1"})
    await shards.publish(QUIET, forged, user_id=user, headers={USER_ID: "shard-5"})
    await shards.publish(QUIET, operators, user_id=user)
    await eventually(
        lambda: shards.answers.answered([own["event_id"], forged["event_id"], operators["event_id"]]) == 3,
        "three answers",
    )
    assert shards.answers.results[own["event_id"]][0]["status"] == Status.SAVED
    assert shards.answers.results[operators["event_id"]][0]["status"] == Status.SAVED
    refusal = shards.answers.results[forged["event_id"]][0]
    assert refusal["status"] == Status.INTERNAL_ERROR
    assert (5, forged["event_id"]) in shards.answers.order, "the refusal went to the sender's own shard"
    assert (QUIET, forged["event_id"]) not in shards.answers.order
    [letter] = await dead_letters(rabbitmq_url, 1)
    assert (letter.headers or {})[USER_ID] == "shard-5"
    written = await ledger(dsn)
    assert own["event_id"] in written
    assert operators["event_id"] in written
    assert forged["event_id"] not in written


# --- bounds per shard ------------------------------------------------------------------------------------

SHARD_QUEUES = r"^ltm\.create_memory\.shard\.[0-9]+$"


async def bound_shard_queues(test_services: Services, rabbitmq_url: str, length: int) -> None:
    """The shipped policy (deploy/rabbitmq/definitions.json), with a small bound, on the test's vhost."""
    vhost = unquote(urlsplit(rabbitmq_url).path[1:])
    await test_services.broker_admin().policy(
        vhost, "ltm-shard-queue-bounds", SHARD_QUEUES, {"max-length": length}
    )


async def publish_all(
    shards: Shards, shard_id: int, bodies: list[dict[str, Any]], **publish: Any
) -> tuple[list[str], list[str]]:
    """(taken, refused): the event ids the broker confirmed and those it nacked, published one after
    another (a quorum queue applies its bound as it applies its log: publishes in flight together may pass
    it by a few)."""
    taken, refused = [], []
    for body in bodies:
        try:
            await shards.publish(shard_id, body, **publish)
        except aio_pika.exceptions.DeliveryError as exc:
            if "Nack" not in repr(exc):
                raise  # a return, not a refusal
            refused.append(body["event_id"])
        else:
            taken.append(body["event_id"])
    return taken, refused


@pytest.mark.slow
async def test_one_shards_backlog_never_gets_another_shards_publishes_refused(
    running: Running, shards: Shards, world: tuple[str, int], rabbitmq_url: str, test_services: Services
) -> None:
    """Shard queues bounded at 20, no worker running: shard 0 publishes 60 events with its own routing key
    and the broker refuses those past its bound; shard 1's next publishes, with its own key and with the
    version-1 key, are taken. Once a worker runs, every event taken is answered once and none refused is."""
    dsn, persona_id = world
    await bound_shard_queues(test_services, rabbitmq_url, 20)
    worker = await running.start()  # the worker sees both shards and gives each its own queue
    warm = [event_body(SAVE, persona_id=persona_id, shard_id=s) for s in (FLOODER, QUIET)]
    for body in warm:
        await shards.publish(body["shard_id"], body)
    await eventually(
        lambda: shards.answers.answered([b["event_id"] for b in warm]) == 2, "the first events' answers"
    )
    for shard_id in (FLOODER, QUIET):
        await eventually(lambda s=shard_id: bounded(test_services, rabbitmq_url, s), "its own queue, bounded")
    worker.stop()
    assert await running.workers.pop()[1] == 0

    flood = [event_body(SAVE, persona_id=persona_id, shard_id=FLOODER) for _ in range(60)]
    taken, refused = await publish_all(shards, FLOODER, flood, key="tool.create_long_term_memory.shard.0")
    assert len(taken) <= 25, f"shard 0 was taken {len(taken)} of 60 past a bound of 20"
    quiet = [event_body(SAVE, persona_id=persona_id, shard_id=QUIET) for _ in range(3)]
    own_key, _ = await publish_all(shards, QUIET, quiet[:2], key="tool.create_long_term_memory.shard.1")
    common, _ = await publish_all(shards, QUIET, quiet[2:])
    assert len(own_key) == 2, "shard 1 was refused with its own key"
    assert len(common) == 1, "shard 1 was refused on the common queue"

    await running.start()
    answered = [*taken, *own_key, *common]
    await eventually(lambda: shards.answers.answered(answered) == len(answered), "every event taken answered")
    assert {shards.answers.count(i) for i in answered} == {1}
    assert not any(i in shards.answers.results for i in refused), "a refused publish was answered"
    written = await ledger(dsn)
    assert set(written) == {*answered, *(b["event_id"] for b in warm)}


async def bounded(test_services: Services, url: str, shard_id: int) -> bool:
    """Shard ``shard_id``'s own queue exists and the broker applies the bounds policy to it (a quorum queue
    takes a policy a moment after it is declared)."""
    vhost = unquote(urlsplit(url).path[1:])
    return await test_services.broker_admin().queue_policy(vhost, shard_queue_name(TOPOLOGY, shard_id)) == (
        "ltm-shard-queue-bounds"
    )


async def declared(url: str, queue: str) -> bool:
    try:
        await depth(url, queue)
    except aio_pika.exceptions.ChannelClosed:
        return False
    return True


@pytest.mark.slow
async def test_a_version_1_flooder_over_its_bound_is_turned_away_and_answered(
    running: Running, shards: Shards, world: tuple[str, int], rabbitmq_url: str, test_services: Services
) -> None:
    """Contract version 1 (the common queue, the shard only in the body), a worker with a window of 40 and
    shard queues bounded at 20: what the worker moves of shard 0's flood past that bound is answered with a
    failure (nothing written for it), and the first of them kept as a shard_backlog_full dead letter (one a
    minute, security review 5, N-I: a flood does not fill the DLQ); shard 1's events are all taken and
    saved; every event of both is answered exactly once."""
    dsn, persona_id = world
    await bound_shard_queues(test_services, rabbitmq_url, 20)
    await running.start(prefetch=40, concurrency=4)
    warm = event_body(SAVE, persona_id=persona_id, shard_id=FLOODER)
    await shards.publish(FLOODER, warm)
    await eventually(lambda: warm["event_id"] in shards.answers.results, "the first event's answer")
    await eventually(lambda: bounded(test_services, rabbitmq_url, FLOODER), "shard 0's own queue, bounded")
    flood_ids = await flood(shards, persona_id, 600)
    quiet = [event_body(SAVE, persona_id=persona_id, shard_id=QUIET) for _ in range(5)]
    taken, refused = await publish_all(shards, QUIET, quiet)
    assert (len(taken), len(refused)) == (5, 0)
    everything = [warm["event_id"], *flood_ids, *taken]
    await eventually(lambda: shards.answers.answered(everything) == len(everything), "every event answered")
    assert {shards.answers.count(i) for i in everything} == {1}
    turned_away = [i for i in flood_ids if shards.answers.results[i][0]["status"] == Status.INTERNAL_ERROR]
    assert turned_away, "no event of the flood was turned away past its bound"
    assert {shards.answers.results[i][0]["status"] for i in taken} == {Status.SAVED}
    assert len(turned_away) > 1
    [letter] = await dead_letters(rabbitmq_url, 1)
    assert (letter.headers or {})["x-ltm-error-kind"] == DeadLetterKind.SHARD_BACKLOG_FULL
    assert (letter.headers or {})["x-ltm-turned-away"] == 0, "the first letter of the minute"
    assert letter.message_id in turned_away
    assert await depth(rabbitmq_url, TOPOLOGY.dead_letter_queue) == 0, "one letter, the others answered"
    written = await ledger(dsn)
    assert not set(turned_away) & set(written), "an event turned away was written"
    assert set(written) == set(everything) - set(turned_away)


async def test_past_its_byte_budget_a_worker_takes_nothing_more_until_half_is_done(
    running: Running, shards: Shards, world: tuple[str, int]
) -> None:
    """LTM_HELD_BYTES_MAX at 100 KB and events of about 10 KB: the worker stops taking from the queues when it
    holds the budget, takes again at half of it, never holds more than the budget and one body (security
    review 5, N-B), and answers every event exactly once."""
    dsn, persona_id = world
    members = [
        member(str(1150000000000001000 + n), f"user{n:02d}", "A name of thirty-two characters!")
        for n in range(60)
    ]
    worker = await running.start(held_bytes_max=100_000, prefetch=200)
    assert worker.fair is not None
    hand, peak = worker.fair.hand, [0]

    async def watch() -> None:
        while True:
            peak[0] = max(peak[0], hand.bytes)
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    bodies = [event_body(SAVE, persona_id=persona_id, shard_id=n % 2, members=members) for n in range(300)]
    assert len(json.dumps(bodies[0])) > 8_000
    await asyncio.gather(*(shards.publish(b["shard_id"], b) for b in bodies))
    ids = [b["event_id"] for b in bodies]
    await eventually(lambda: shards.answers.answered(ids) == len(ids), "every event answered")
    watcher.cancel()
    assert 100_000 <= peak[0] <= 100_000 + MARGIN_BYTES
    assert {shards.answers.count(i) for i in ids} == {1}
    assert running.count("holding too many event bytes; the queues wait") >= 1
    assert running.count("the queues are consumed again") >= 1
    written = await ledger(dsn)
    assert set(written) == set(ids)


async def test_worker_shards_adds_up_what_the_workers_saw_of_each_shard(
    running: Running, shards: Shards, world: tuple[str, int], rabbitmq_url: str
) -> None:
    """`worker shards`, without Prometheus: two workers record what they saw; the report has each shard's
    events in and answered, its wait, its share of the events in, and its own queue's depth; a shard with a
    queue and nothing in the window is folded into one line."""
    _, persona_id = world
    # windows of 4: the broker hands the 40 events to both workers in turn (with the default window of 8,192
    # the first worker can take all of them, and the second has nothing to record)
    await running.start(metrics_interval_seconds=1, prefetch=4)
    await running.start(metrics_interval_seconds=1, prefetch=4)
    [declared_ahead] = await declare_shards(running.settings, [9])  # a queue, and no event: a quiet shard
    assert declared_ahead.removed, declared_ahead.detail
    bodies = [event_body(SAVE, persona_id=persona_id, shard_id=FLOODER) for _ in range(30)]
    bodies += [event_body(SAVE, persona_id=persona_id, shard_id=QUIET) for _ in range(10)]
    await asyncio.gather(*(shards.publish(b["shard_id"], b) for b in bodies))
    ids = [b["event_id"] for b in bodies]
    await eventually(lambda: shards.answers.answered(ids) == len(ids), "every event answered")

    async def reported() -> Report | None:
        report = await gather(running.settings, minutes=5)
        answered = {line.shard_id: line.answered for line in report.shards}
        everything = answered.get(FLOODER) == 30 and answered.get(QUIET) == 10 and report.workers == 2
        return report if everything else None

    await eventually(reported, "both shards' answers recorded, by both workers")
    report = await reported()
    assert report is not None
    assert report.problems == []
    assert report.workers == 2
    loud, quiet = report.shards[0], report.shards[1]
    assert (loud.shard_id, quiet.shard_id) == (FLOODER, QUIET)
    # "in" counts deliveries: an event the broker delivers again (after it closed a worker's connection, as
    # the test container's broker did once with INTERNAL_ERROR on a busy machine) is counted again
    assert loud.received >= 30
    assert quiet.received >= 10
    assert loud.share_in == pytest.approx(loud.received / (loud.received + quiet.received))
    assert loud.wait_p99_le_s is not None
    assert loud.queued == 0, "shard 0's own queue was declared and is empty"
    # the counts' age is Postgres's clock against the newest row the workers wrote; the depths are RabbitMQ's
    assert report.counts_age_s is not None
    assert report.counts_age_s >= 0
    table = render(report).splitlines()
    assert table[1].startswith(f"counts as of {report.counts_age_s:.0f} s ago (the workers write them every ")
    assert table[2].split()[:3] == ["shard", "in", "answered"]
    assert table[3].split()[:3] == ["0", str(loud.received), "30"]
    assert json.loads(as_json(report))["shards"][0]["shard_id"] == FLOODER
    # a bound past the last bucket is "inf" in JSON (the test bodies' issued_at may be long past)
    bound = "inf" if loud.wait_p99_le_s == float("inf") else loud.wait_p99_le_s
    assert json.loads(as_json(report))["shards"][0]["wait_p99_le_s"] == bound
    assert [line.shard_id for line in report.shards if line.quiet] == [9]
    assert "1 quiet shard(s) not shown: nothing in, answered, held or queued (--all lists them)" in table
    assert [row.split()[0] for row in render(report, show_quiet=True).splitlines()[3:6]] == ["0", "1", "9"]
    assert json.loads(as_json(report))["quiet_shards_not_shown"] == 1
    # inside the shard, its guilds (one here): events in, held, moved; no metric label per guild
    [guild] = loud.guilds
    assert (guild.guild, guild.received, guild.share_in) == (GUILD, loud.received, 1.0)
    assert json.loads(as_json(report))["shards"][0]["guilds"][0]["guild"] == GUILD


# --- no new doors: nothing per shard for a claim that failed a check (security review 5, N-A, N-D) ----------


def vhost_of(url: str) -> str:
    return unquote(urlsplit(url).path[1:])


def shard_queues_in(admin: ManagementApi, vhost: str) -> set[str]:
    return {
        row["name"]
        for row in admin.call("GET", f"/queues/{quote(vhost, safe='')}")
        if re.fullmatch(SHARD_QUEUES, row["name"])
    }


@pytest.fixture
async def shard_zero(test_services: Services, rabbitmq_url: str) -> AsyncIterator[tuple[str, str]]:
    """A RabbitMQ user of shard 0's own, on the test's vhost: (its URL, the LTM_SHARD_USER format)."""
    admin = test_services.broker_admin()
    if not isinstance(admin, ManagementApi):
        pytest.skip("needs RabbitMQ's management API to create a user (docs/tests.md)")
    prefix = f"t{uuid.uuid4().hex[:8]}-shard-"
    user, password = f"{prefix}0", uuid.uuid4().hex
    admin.put_user(user, password)
    admin.set_permissions(vhost_of(rabbitmq_url), user, {"configure": ".*", "write": ".*", "read": ".*"})
    parts = urlsplit(rabbitmq_url)
    url = urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}"))
    try:
        yield url, prefix + "{shard_id}"
    finally:
        admin.delete_user(user)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


async def test_a_shards_claims_that_fail_a_check_get_no_queue_no_row_and_no_series(
    running: Running,
    shards: Shards,
    world: tuple[str, int],
    rabbitmq_url: str,
    test_services: Services,
    shard_zero: tuple[str, str],
) -> None:
    """Security review 5, N-A and N-D, as the review ran them: shard 0, logged in as itself (user_id set,
    LTM_SHARD_IDENTITY=required), sends one-line bodies {"shard_id": N} for 300 shards and valid events
    naming 20 other shards. Every one is dead-lettered; no shard queue, no row of ltm_shard_queues and no
    shard label is made for any of them. Shard 0's own event is saved and earns shard 0 its queue."""
    dsn, persona_id = world
    url, user_format = shard_zero
    port = free_port()
    await running.start(shard_identity="required", shard_user=user_format, http_port=port)
    sender = user_format.replace("{shard_id}", "0")
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(TOPOLOGY.tool_calls_exchange, ensure=False)

        async def send(body: bytes) -> None:
            message = aio_pika.Message(body, user_id=sender, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            await exchange.publish(message, "tool.create_long_term_memory")

        junk = [json.dumps({"shard_id": n}).encode() for n in range(2, 302)]
        forged = [
            json.dumps(event_body(SAVE, persona_id=persona_id, shard_id=n)).encode() for n in range(400, 420)
        ]
        await asyncio.gather(*(send(body) for body in junk + forged))
        own = event_body(SAVE, persona_id=persona_id, shard_id=FLOODER)
        await send(json.dumps(own).encode())
    finally:
        await connection.close()
    await eventually(lambda: own["event_id"] in shards.answers.results, "shard 0's own event answered")
    await eventually(
        lambda: depth_is(rabbitmq_url, TOPOLOGY.dead_letter_queue, 320), "the 320 claims dead-lettered"
    )
    assert shards.answers.results[own["event_id"]][0]["status"] == Status.SAVED
    admin = test_services.broker_admin()
    assert isinstance(admin, ManagementApi)
    await eventually(
        lambda: shard_queues_in(admin, vhost_of(rabbitmq_url)) == {shard_queue_name(TOPOLOGY, FLOODER)},
        "shard 0's queue, and no other",
    )
    conn = await asyncpg.connect(dsn)
    try:
        assert [r["shard_id"] for r in await conn.fetch("SELECT shard_id FROM ltm_shard_queues")] == [FLOODER]
    finally:
        await conn.close()
    exposition = await asyncio.to_thread(scrape, port)
    labels = set(re.findall(r'^ltm_shard_[a-z_]+\{shard="([^"]+)"', exposition, flags=re.M))
    assert labels == {str(FLOODER)}, f"shard labels: {sorted(labels)[:10]}"


async def test_the_shard_queue_cap_holds_across_workers(
    running: Running, shards: Shards, world: tuple[str, int], rabbitmq_url: str
) -> None:
    """LTM_SHARD_QUEUES_MAX counts the rows of every worker: two workers at a cap of 3, events of 12 shards
    arriving on both at once, give 3 shards a queue; the others share the common queue and every event is
    answered once."""
    dsn, persona_id = world
    await running.start(shard_queues_max=3)
    await running.start(shard_queues_max=3)
    bodies = [event_body(SAVE, persona_id=persona_id, shard_id=n) for n in range(10, 22) for _ in range(5)]
    await shards.open(*range(10, 22))
    await asyncio.gather(*(shards.publish(b["shard_id"], b) for b in bodies))
    ids = [b["event_id"] for b in bodies]
    await eventually(lambda: shards.answers.answered(ids) == len(ids), "every event answered")
    assert {shards.answers.count(i) for i in ids} == {1}
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetchval("SELECT count(*) FROM ltm_shard_queues")
    finally:
        await conn.close()
    assert rows == 3
    queues = [shard_queue_name(TOPOLOGY, n) for n in range(10, 22)]
    assert sum([await declared(rabbitmq_url, queue) for queue in queues]) == 3
    cap = "shard queue cap reached (rows of ltm_shard_queues, all workers); further shards share the "
    cap += "common queue"
    assert running.count(cap) >= 1


@pytest.mark.slow
async def test_worker_shards_forget_removes_a_gone_shards_row_then_its_queue_and_leaves_one_with_events(
    running: Running, shards: Shards, world: tuple[str, int], rabbitmq_url: str
) -> None:
    """`worker shards --forget`: with a worker running, a shard heard from lately is left; once it is quiet
    its empty queue is gone for good (its row went first, so no refresh declares it again); a queue that
    still holds an event is left, row and all."""
    dsn, persona_id = world
    await running.start(metrics_interval_seconds=1)
    first = event_body(SAVE, persona_id=persona_id, shard_id=FLOODER)
    await shards.publish(FLOODER, first)
    await eventually(lambda: first["event_id"] in shards.answers.results, "shard 0's event answered")
    await eventually(lambda: declared(rabbitmq_url, shard_queue_name(TOPOLOGY, FLOODER)), "shard 0's queue")

    async def heard() -> bool:
        report = await gather(running.settings, minutes=5)
        return any(line.shard_id == FLOODER and line.received for line in report.shards)

    await eventually(heard, "shard 0's event recorded")
    [recent] = await forget_shards(running.settings, [FLOODER])
    assert not recent.removed
    assert "not gone" in recent.detail
    assert await declared(rabbitmq_url, shard_queue_name(TOPOLOGY, FLOODER))
    connection = await aio_pika.connect(rabbitmq_url)
    try:  # shard 9: a queue with an event in it (no row: no worker consumes it)
        channel = await connection.channel()
        await declare_shard_queue(channel, TOPOLOGY, 9)
        await channel.default_exchange.publish(
            aio_pika.Message(b"{}"), routing_key=shard_queue_name(TOPOLOGY, 9)
        )
    finally:
        await connection.close()
    await eventually(lambda: depth_is(rabbitmq_url, shard_queue_name(TOPOLOGY, 9), 1), "shard 9's event")
    results = await forget_shards(running.settings, [FLOODER, 9, 4], quiet_minutes=0)
    assert [(r.shard_id, r.removed) for r in results] == [(FLOODER, True), (9, False), (4, True)]
    assert "holds 1 event(s)" in results[1].detail
    await asyncio.sleep(2 * REFRESH_SECONDS)  # two refreshes of the worker's record: none declares it again
    assert not await declared(rabbitmq_url, shard_queue_name(TOPOLOGY, FLOODER))
    assert await depth(rabbitmq_url, shard_queue_name(TOPOLOGY, 9)) == 1
    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM ltm_shard_queues WHERE shard_id = $1", FLOODER) == 0
    finally:
        await conn.close()


@pytest.mark.slow
async def test_worker_shards_declare_takes_the_common_queue_out_of_a_kit_shards_path_from_its_first_event(
    running: Running, shards: Shards, world: tuple[str, int], rabbitmq_url: str
) -> None:
    """`worker shards --declare 0`: shard 0's first event on its own key is routed to its own queue (no
    return, no fallback through the common queue) and answered; past the cap a shard is left, saying so."""
    _, persona_id = world
    worker = await running.start()
    results = await declare_shards(running.settings.model_copy(update={"shard_queues_max": 1}), [FLOODER, 5])
    assert [(r.shard_id, r.removed) for r in results] == [(FLOODER, True), (5, False)]
    assert "cap" in results[1].detail
    assert worker.fair is not None
    first = event_body(SAVE, persona_id=persona_id, shard_id=FLOODER)
    await shards.publish(FLOODER, first, key="tool.create_long_term_memory.shard.0")
    await eventually(lambda: first["event_id"] in shards.answers.results, "the first event's answer")
    assert shards.answers.results[first["event_id"]][0]["status"] == Status.SAVED
    assert not await declared(rabbitmq_url, shard_queue_name(TOPOLOGY, 5))
