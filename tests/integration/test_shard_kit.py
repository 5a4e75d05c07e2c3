"""The Python shard kit (``contracts.shard``) against the real worker (in this test's event loop), RabbitMQ,
Postgres and Redis, each test on its own database and vhost, as the TypeScript kit's tests do: saves with
typed results, the properties on the wire, notices once, the invalidations by kind; who sent an event
(``user_id``); the shard's own routing key, its fallback and its queue; the typed refusals (a full queue's
nack, a refused ``user_id`` or routing key, an unroutable event, a refused login); a timed-out call's late
result and its retry; ``close()``; the subscriber over a Redis restart. Waits are on what arrives, never on
time alone."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import shutil
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import aio_pika
import asyncpg
import pytest

from contracts.models import Notification, ServerStateInvalidation, Status, ToolResult, UserInvalidation
from contracts.shard import (
    InvalidationSubscriber,
    InvalidEventError,
    LateResultInfo,
    LtmBacklogFullError,
    LtmClient,
    LtmClientError,
    LtmClosedError,
    LtmEventTooLargeError,
    LtmGuildBusyError,
    LtmIdentityError,
    LtmPublishRefusedError,
    LtmPublishRejectedError,
    LtmTimeoutError,
    LtmUnroutableError,
    invalidation_id_of,
)
from tests.factories import BOT, CHANNEL, GUILD, TRIGGER, BotRows, World, member, participant
from tests.services import is_this_machine
from tests.support.commands import run_command
from tests.support.harness import queue_depth
from tests.support.outages import PrivateRedis, find_redis_server
from tests.support.wait import eventually
from worker.broker.topology import work_queue_arguments
from worker.config import Settings, Topology
from worker.runner import Worker
from worker.testing.seed import seed_try_out

WAIT = 60.0
SHARD = 3
SPARROW = "1150000000000000201"
TOOLS = ("create_long_term_memory", "remember_this_fact")
OWN_QUEUE = f"ltm.create_memory.shard.{SHARD}"
EXCHANGES = ("tomori.tool_calls", "tomori.tool_results", "tomori.notifications", "tomori.dead_letter")


class Inbox:
    """What the client's callbacks received."""

    def __init__(self) -> None:
        self.notices: list[Notification] = []
        self.late: list[tuple[ToolResult, LateResultInfo]] = []
        self.states: list[ServerStateInvalidation] = []
        self.users: list[UserInvalidation] = []

    async def notice(self, notification: Notification) -> None:
        self.notices.append(notification)

    def late_result(self, result: ToolResult, info: LateResultInfo) -> None:
        self.late.append((result, info))


def context(persona_id: int, **extra: Any) -> dict[str, Any]:
    return {
        "guild_disc_id": GUILD,
        "channel_disc_id": CHANNEL,
        "triggering_user_disc_id": TRIGGER,
        "bot_user_disc_id": BOT,
        "persona_id": persona_id,
        "participants": [participant(SPARROW, "Sparrow", ["Sparrow", "sparrow_ow"])],
        "guild_members": [member(SPARROW, "sparrow_ow", "Sparrow")],
        **extra,
    }


def call_id() -> str:
    return f"call_py_{secrets.token_hex(4)}"


@pytest.fixture
async def world(rows: BotRows) -> World:
    world = await rows.world()
    await rows.user(SPARROW)
    return world


@pytest.fixture
async def worker(migrated_dsn: str, rabbitmq_url: str, redis_url: str) -> AsyncIterator[Worker]:
    """One worker in this test's event loop, consuming the test's vhost (it declares the topology)."""
    settings = Settings(
        postgres_dsn=migrated_dsn,
        rabbitmq_url=rabbitmq_url,
        redis_url=redis_url,
        http_port=0,
        retry_base_delay_ms=100,
        retry_max_delay_ms=400,
        shutdown_grace_seconds=WAIT,
    )
    running = Worker(settings)
    task = asyncio.create_task(running.run(signals=False))
    await wait_for_consumer(rabbitmq_url, task)
    try:
        yield running
    finally:
        running.stop()
        try:
            await asyncio.wait_for(task, WAIT)
        except BaseException:
            task.cancel()


async def wait_for_consumer(url: str, task: asyncio.Task[int]) -> None:
    """Until the work queue has a consumer (the worker's), failing at once when the worker ended."""

    async def consumed() -> bool:
        if task.done():
            raise AssertionError(f"the worker ended: {task.result()}")
        connection = await aio_pika.connect(url)
        try:
            channel = await connection.channel()
            queue = await channel.declare_queue(Topology().work_queue, passive=True)
            return bool(queue.declaration_result.consumer_count)
        except aio_pika.exceptions.ChannelClosed:
            return False
        finally:
            await connection.close()

    await eventually(consumed, "the worker consumes", WAIT, interval=0.1)


async def taken(
    queue: aio_pika.abc.AbstractQueue, n: int, *, ack: bool = False
) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """The first ``n`` messages of ``queue`` (``basic.get``, acked with ``ack``), once they are there."""
    got: list[aio_pika.abc.AbstractIncomingMessage] = []

    async def all_there() -> bool:
        while len(got) < n and (message := await queue.get(fail=False)) is not None:
            if ack:
                await message.ack()
            got.append(message)
        return len(got) >= n

    await eventually(all_there, f"{n} message(s) in {queue.name}", WAIT, interval=0.05)
    return got


async def declare(url: str, body: Callable[[aio_pika.abc.AbstractChannel], Any] | None = None) -> None:
    """The contract's exchanges (what the definitions or a worker's start-up declare), and more."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        for name in EXCHANGES:
            await channel.declare_exchange(name, aio_pika.ExchangeType.TOPIC, durable=True)
        if body is not None:
            await body(channel)
    finally:
        await connection.close()


async def own_queue(channel: aio_pika.abc.AbstractChannel, *, max_length: int | None = None) -> None:
    """The shard's own queue as the workers will declare it (the work queue's arguments), with its keys."""
    arguments = work_queue_arguments(Topology())
    if max_length is not None:
        arguments["x-max-length"] = max_length
    queue = await channel.declare_queue(OWN_QUEUE, durable=True, arguments=arguments)
    for tool in TOOLS:
        await queue.bind("tomori.tool_calls", f"tool.{tool}.shard.{SHARD}")


async def outcome(client: LtmClient, **request: Any) -> ToolResult | BaseException:
    try:
        return await client.create_memory(
            tool_call_id=call_id(),
            arguments=request.pop("arguments", {"memory_content": "x"}),
            context=request.pop("context", context(7)),
            **request,
        )
    except Exception as error:
        return error


async def test_saves_through_the_worker_typed_results_the_wire_notices_and_invalidations(
    worker: Worker, world: World, rabbitmq_url: str, redis_url: str
) -> None:
    inbox = Inbox()
    spy_connection = await aio_pika.connect(rabbitmq_url)
    spy_channel = await spy_connection.channel()
    # bound with the worker's keys: a wildcard would take the shard's own key, which no worker binds here
    spy = await spy_channel.declare_queue("", exclusive=True)
    for tool in TOOLS:
        await spy.bind("tomori.tool_calls", f"tool.{tool}")
    invalidations = await InvalidationSubscriber.start(
        redis_url, on_server_state=inbox.states.append, on_user=inbox.users.append
    )
    client = await LtmClient.connect(rabbitmq_url, SHARD, on_notice=inbox.notice, timeout=WAIT)
    try:
        assert client.routing_key_for() == f"tool.create_long_term_memory.shard.{SHARD}"
        server_call = call_id()
        server = await client.create_memory(
            tool_call_id=server_call,
            arguments={"memory_content": "{user} likes dogs", "memory_scope": "server_wide"},
            context=context(world.persona_id),
            traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )
        personal = await client.create_memory(
            tool_call_id=call_id(),
            tool_name="remember_this_fact",
            arguments={
                "memory_content": "{user} likes cats",
                "memory_scope": "target_user",
                "target_user": "Sparrow",
            },
            context=context(world.persona_id),
        )
        # the worker binds no per-shard queue: the first publish came back and went with tool.<name>
        assert client.routing_key_for() == "tool.create_long_term_memory"

        assert isinstance(server, ToolResult)
        assert (server.status, server.success, server.replayed) == (Status.SAVED, True, False)
        assert server.tool_call_id == server_call
        assert server.data["scope"] == "server_wide"
        assert personal.status is Status.SAVED
        assert personal.tool_name == "remember_this_fact"
        assert personal.data["target_user"] == "Sparrow"

        wires = {str(message.message_id): message for message in await taken(spy, 2)}
        wire = wires[str(server.event_id)]
        assert wire.routing_key == "tool.create_long_term_memory"
        assert wire.content_type == "application/json"
        assert wire.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert wire.correlation_id == server_call
        assert wire.type == "tool_call.v1"
        assert wire.user_id == urlsplit(rabbitmq_url).username  # the user this connection logs in as
        assert (wire.headers or {}).get(
            "traceparent"
        ) == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        body = json.loads(wire.body)
        assert (body["event_id"], body["shard_id"], body["schema_version"]) == (
            str(server.event_id),
            SHARD,
            1,
        )
        assert wires[str(personal.event_id)].routing_key == "tool.remember_this_fact"

        await eventually(lambda: len(inbox.notices) == 2, "both notices")
        kinds = {str(n.event_id): n.notice.kind for n in inbox.notices}
        assert kinds == {str(server.event_id): "server_memory", str(personal.event_id): "personal_memory"}
        await eventually(
            lambda: (
                any(m.invalidation_id == invalidation_id_of(server.event_id) for m in inbox.states)
                and any(m.invalidation_id == invalidation_id_of(personal.event_id) for m in inbox.users)
            ),
            "both invalidations",
        )
        [state] = [m for m in inbox.states if m.invalidation_id == invalidation_id_of(server.event_id)]
        assert state.server_disc_id == GUILD
        [user] = [m for m in inbox.users if m.invalidation_id == invalidation_id_of(personal.event_id)]
        assert user.user_disc_id == SPARROW
    finally:
        await client.close()
        await invalidations.close()
        await spy_connection.close()


async def test_a_personal_memory_of_the_test_stacks_seeded_member_is_saved(
    worker: Worker, migrated_dsn: str, rabbitmq_url: str
) -> None:
    """worker.testing's seed (what `ltm_shard.seed()` returns) gives the event the member Sparrow, as the
    TypeScript stack's does: a `target_user` save names them; the same event without them is
    `user_not_found`."""
    try_out = await seed_try_out(migrated_dsn)
    personal = {
        "memory_content": "{user} likes cats",
        "memory_scope": "target_user",
        "target_user": "Sparrow",
    }
    async with await LtmClient.connect(rabbitmq_url, SHARD, timeout=WAIT) as client:
        saved = await client.create_memory(
            tool_call_id=call_id(), arguments=personal, context=try_out.context()
        )
        alone = await client.create_memory(
            tool_call_id=call_id(), arguments=personal, context=try_out.context(participants=[], members=[])
        )
    assert saved.status is Status.SAVED, saved
    assert saved.data["target_user"] == "Sparrow"
    assert alone.status is Status.USER_NOT_FOUND, alone
    connection = await asyncpg.connect(migrated_dsn)
    try:
        row = await connection.fetchrow(
            "SELECT user_id, persona_lineage_id FROM personal_memories WHERE personal_memory_id = $1",
            saved.data["memory_id"],
        )
    finally:
        await connection.close()
    assert (row["user_id"], row["persona_lineage_id"]) == (try_out.member_user_id, try_out.persona_lineage_id)


async def test_with_the_shards_own_queue_bound_the_event_lands_there_by_its_key(rabbitmq_url: str) -> None:
    await declare(rabbitmq_url, own_queue)
    client = await LtmClient.connect(rabbitmq_url, SHARD)
    calls = [
        asyncio.create_task(outcome(client)),
        asyncio.create_task(outcome(client, tool_name="remember_this_fact")),
    ]
    connection = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await connection.channel()
        queue = await channel.get_queue(OWN_QUEUE, ensure=False)
        both = await taken(queue, 2, ack=True)
        assert sorted(m.routing_key or "" for m in both) == [f"tool.{t}.shard.{SHARD}" for t in TOOLS]
        for message in both:
            body = json.loads(message.body)
            assert message.user_id == urlsplit(rabbitmq_url).username
            assert message.message_id == body["event_id"]
            assert message.correlation_id == body["tool_call_id"]
            assert message.type == "tool_call.v1"
        assert client.routing_key_for() == f"tool.create_long_term_memory.shard.{SHARD}"
    finally:
        await connection.close()
        await client.close()
    assert all(isinstance(error, LtmClosedError) for error in [await call for call in calls])


@pytest.mark.parametrize("per_shard", [True, False])
async def test_a_queue_at_its_bound_nacks_with_backlog_full(rabbitmq_url: str, per_shard: bool) -> None:
    async def bounded(channel: aio_pika.abc.AbstractChannel) -> None:
        await own_queue(channel, max_length=1)
        arguments = {**work_queue_arguments(Topology()), "x-max-length": 1}
        common = await channel.declare_queue("ltm.create_memory", durable=True, arguments=arguments)
        await common.bind("tomori.tool_calls", "tool.create_long_term_memory")

    await declare(rabbitmq_url, bounded)
    client = await LtmClient.connect(rabbitmq_url, SHARD, per_shard_routing=per_shard)
    waiting: list[asyncio.Task[ToolResult | BaseException]] = []
    refused: BaseException | ToolResult | None = None
    try:
        # events go in until the queue is over its bound (a quorum queue takes one past x-max-length)
        while refused is None and len(waiting) < 5:
            call = asyncio.create_task(outcome(client))
            if await refused_or_taken(call, rabbitmq_url, len(waiting) + 1):
                refused = call.result()
            else:
                waiting.append(call)
        assert isinstance(refused, LtmBacklogFullError), refused
        assert isinstance(refused, LtmPublishRejectedError)
        assert (refused.code, refused.shard_id, refused.per_shard) == ("backlog_full", SHARD, per_shard)
        if per_shard:
            assert refused.queue == OWN_QUEUE
            assert refused.routing_key == f"tool.create_long_term_memory.shard.{SHARD}"
            assert f"shard {SHARD}'s own queue {OWN_QUEUE} is at its bound" in str(refused)
        else:
            assert refused.queue == "ltm.create_memory"
            assert "the common work queue ltm.create_memory is at its bound" in str(refused)
        assert "Slow down and retry later with the same event_id" in str(refused)
        assert 1 <= len(waiting) <= 2
    finally:
        await client.close()
    assert all(isinstance(error, LtmClosedError) for error in [await call for call in waiting])


async def refused_or_taken(call: asyncio.Task[Any], url: str, depth: int) -> bool:
    """True once ``call`` ended (refused), False once the bounded queues hold ``depth`` events."""
    connection = await aio_pika.connect(url)
    try:
        channel = await (await connection.channel()).get_underlay_channel()

        async def settled() -> str | None:
            if call.done():
                return "refused"
            held = 0
            for name in (OWN_QUEUE, "ltm.create_memory"):
                held += (await channel.queue_declare(name, passive=True)).message_count or 0
            return "taken" if held >= depth else None

        return await eventually(settled, f"event {depth} refused or taken", WAIT, interval=0.05) == "refused"
    finally:
        await connection.close()


async def test_a_user_id_not_the_connections_is_refused_and_false_sends_none(rabbitmq_url: str) -> None:
    async def parked(channel: aio_pika.abc.AbstractChannel) -> None:
        queue = await channel.declare_queue("parked", durable=True)
        await queue.bind("tomori.tool_calls", "tool.#")

    await declare(rabbitmq_url, parked)
    wrong = await LtmClient.connect(rabbitmq_url, SHARD, user_id="shard-4")
    try:
        refused = await outcome(wrong)
        assert isinstance(refused, LtmIdentityError), refused
        assert (refused.code, refused.user_id) == ("identity_refused", "shard-4")
        login = urlsplit(rabbitmq_url).username
        assert f"user_id property set to 'shard-4' but authenticated user was '{login}'" in str(refused)
        again = await outcome(wrong)
        assert isinstance(again, LtmIdentityError)
        assert wrong.in_flight == 0
    finally:
        await wrong.close()
    anonymous = await LtmClient.connect(rabbitmq_url, SHARD, user_id=False)
    try:
        assert anonymous.publishing_as is None
        call = asyncio.create_task(outcome(anonymous))
        connection = await aio_pika.connect(rabbitmq_url)
        try:
            queue = await (await connection.channel()).get_queue("parked", ensure=False)
            (message,) = await taken(queue, 1)
            assert message.user_id is None
        finally:
            await connection.close()
    finally:
        await anonymous.close()
    assert isinstance(await call, LtmClosedError)


async def rabbitmqctl(url: str) -> str:
    """This machine's ``rabbitmqctl`` when it manages the test's broker (it makes the users), else skip."""
    ctl = shutil.which("rabbitmqctl")
    if ctl is None or not is_this_machine(urlsplit(url).hostname or ""):
        pytest.skip("needs rabbitmqctl on the broker's machine to make users")
    vhost = urlsplit(url).path[1:]
    code, text = await run_command(ctl, "list_vhosts", "name", "--quiet", "--no-table-headers", timeout=60)
    if code != 0 or vhost not in text.split():
        pytest.skip("this machine's rabbitmqctl manages another broker than the test's")
    return ctl


@pytest.mark.slow
async def test_a_topic_permission_from_before_the_shards_key_moves_the_client_to_tool_name(
    worker: Worker, world: World, rabbitmq_url: str
) -> None:
    ctl = await rabbitmqctl(rabbitmq_url)
    vhost = urlsplit(rabbitmq_url).path[1:]
    password = secrets.token_hex(12)
    users = {
        f"ltm-py-old-{secrets.token_hex(4)}": r"^tool\.[A-Za-z0-9_]+$",
        f"ltm-py-narrow-{secrets.token_hex(4)}": rf"^tool\.remember_this_fact(\.shard\.{SHARD + 1})?$",
    }
    for user, topic in users.items():
        for command in (
            ("add_user", user, password),
            ("set_permissions", "-p", vhost, user, ".*", ".*", ".*"),
            ("set_topic_permissions", "-p", vhost, user, "tomori.tool_calls", topic, "^$"),
        ):
            code, text = await run_command(ctl, *command, timeout=60)
            assert code == 0, text
    old_user, narrow_user = users
    parts = urlsplit(rabbitmq_url)

    def url_of(user: str) -> str:
        return parts._replace(
            netloc=f"{quote(user)}:{password}@{parts.hostname}:{parts.port or 5672}"
        ).geturl()

    old = await LtmClient.connect(url_of(old_user), SHARD, timeout=WAIT)
    narrow = await LtmClient.connect(url_of(narrow_user), SHARD + 1, timeout=WAIT)
    try:
        assert old.publishing_as == old_user
        saved = await old.create_memory(
            tool_call_id=call_id(),
            arguments={"memory_content": "{user} likes old permissions", "memory_scope": "server_wide"},
            context=context(world.persona_id),
        )
        assert saved.status is Status.SAVED
        assert old.routing_key_for() == "tool.create_long_term_memory"

        refused = await outcome(narrow, context=context(world.persona_id))
        assert isinstance(refused, LtmPublishRefusedError), refused
        assert (refused.code, refused.routing_key) == ("publish_refused", "tool.create_long_term_memory")
        allowed = await narrow.create_memory(
            tool_call_id=call_id(),
            tool_name="remember_this_fact",
            arguments={"memory_content": "{user} likes narrow permissions", "memory_scope": "server_wide"},
            context=context(world.persona_id),
        )
        assert allowed.status is Status.SAVED
    finally:
        await old.close()
        await narrow.close()
        for user in users:
            await run_command(ctl, "delete_user", user, timeout=60)


async def test_no_worker_the_call_times_out_its_late_result_and_a_retry_with_the_same_event_id(
    migrated_dsn: str, rabbitmq_url: str, redis_url: str, world: World
) -> None:
    inbox = Inbox()
    settings = Settings(
        postgres_dsn=migrated_dsn, rabbitmq_url=rabbitmq_url, redis_url=redis_url, http_port=0
    )
    # the topology first (a worker that stops at once), then no worker: the event waits in the queue
    first = Worker(settings)
    task = asyncio.create_task(first.run(signals=False))
    await wait_for_consumer(rabbitmq_url, task)
    first.stop()
    await asyncio.wait_for(task, WAIT)
    client = await LtmClient.connect(
        rabbitmq_url, SHARD, on_notice=inbox.notice, on_late_result=inbox.late_result, timeout=0.5
    )
    later = Worker(settings)
    later_task: asyncio.Task[int] | None = None
    try:
        event_id = str(uuid.uuid4())
        request = {
            "tool_call_id": call_id(),
            "arguments": {"memory_content": "{user} likes patience", "memory_scope": "server_wide"},
            "context": context(world.persona_id),
            "event_id": event_id,
        }
        with pytest.raises(LtmTimeoutError) as timed_out:
            await client.create_memory(**request)
        assert timed_out.value.event_id == event_id
        assert "may still have been saved" in str(timed_out.value)
        later_task = asyncio.create_task(later.run(signals=False))
        await eventually(lambda: len(inbox.late) == 1, "the late result")
        result, info = inbox.late[0]
        assert (str(result.event_id), result.status, info.reason) == (event_id, Status.SAVED, "timed_out")
        await eventually(lambda: len(inbox.notices) == 1, "the notice of the saved memory")
        # the retry with the same event id gets the stored answer
        retried = await client.create_memory(**request, timeout=WAIT)
        assert (str(retried.event_id), retried.status, retried.replayed) == (event_id, Status.SAVED, True)
        assert len(inbox.notices) == 1, "a notice again for the replayed event"
    finally:
        await client.close()
        later.stop()
        if later_task is not None:
            await asyncio.wait_for(later_task, WAIT)


async def test_one_guild_cannot_fill_its_shards_queue_ahead_of_the_others(rabbitmq_url: str) -> None:
    """No worker runs, so every call waits for its result: a guild's calls past ``guild_in_flight_max`` are
    refused at once, unpublished, while the shard's other guild (and a direct message) still publish; once
    one of the guild's calls ends, the guild may publish again."""
    await declare(rabbitmq_url, own_queue)
    client = await LtmClient.connect(rabbitmq_url, SHARD, guild_in_flight_max=3)
    loud, quiet = context(7), context(7, guild_disc_id="1150000000000000999")
    direct = {**context(7), "guild_disc_id": None}
    try:
        waiting = [asyncio.create_task(outcome(client, context=loud, timeout=WAIT)) for _ in range(3)]
        await eventually(lambda: _depth_reaches(rabbitmq_url, OWN_QUEUE, 3), "the guild's three wait", WAIT)
        busy = await outcome(client, context=loud)
        assert isinstance(busy, LtmGuildBusyError), busy
        assert (busy.guild, busy.waiting, busy.code) == (GUILD, 3, "guild_busy")
        assert f"guild {GUILD} already has 3 calls waiting for their results" in str(busy)
        assert client.in_flight == 3
        others = [
            asyncio.create_task(outcome(client, context=quiet, timeout=WAIT)),
            asyncio.create_task(outcome(client, context=direct, timeout=WAIT)),
        ]
        await eventually(
            lambda: _depth_reaches(rabbitmq_url, OWN_QUEUE, 5), "the other guild and the DM publish", WAIT
        )
        # one of the guild's calls ends (here cancelled; a result or a timeout alike): one more may go
        waiting[0].cancel()
        await asyncio.gather(waiting[0], return_exceptions=True)
        again = asyncio.create_task(outcome(client, context=loud, timeout=WAIT))
        await eventually(
            lambda: _depth_reaches(rabbitmq_url, OWN_QUEUE, 6), "the guild publishes again", WAIT
        )
        assert await queue_depth(rabbitmq_url, OWN_QUEUE) == 6
    finally:
        await client.close()
    assert all(isinstance(r, LtmClosedError) for r in await asyncio.gather(*waiting[1:], *others, again))


async def _depth_reaches(url: str, name: str, depth: int) -> bool:
    return await queue_depth(url, name) >= depth


async def test_refusals_before_anything_is_published(rabbitmq_url: str) -> None:
    parts = urlsplit(rabbitmq_url)
    wrong_password = parts._replace(
        netloc=f"guest:wrong-{secrets.token_hex(4)}@{parts.hostname}:{parts.port}"
    )
    with pytest.raises(
        LtmClientError, match=r'^RabbitMQ refused the login of user "guest" \(ACCESS_REFUSED\)'
    ):
        await LtmClient.connect(wrong_password.geturl(), SHARD, startup_retries=5)
    missing = parts._replace(path="/ltm-no-such-vhost")
    login = re.escape(parts.username or "")
    refused_vhost = rf'^RabbitMQ refused vhost "ltm-no-such-vhost" to user "{login}"'
    with pytest.raises(LtmClientError, match=refused_vhost):
        await LtmClient.connect(missing.geturl(), SHARD, startup_retries=5)
    with pytest.raises(LtmClientError, match=r"NOT_FOUND - no exchange 'tomori\.tool_calls'"):
        await LtmClient.connect(rabbitmq_url, SHARD)

    await declare(rabbitmq_url)
    client = await LtmClient.connect(rabbitmq_url, SHARD)
    try:
        unroutable = await outcome(client)
        assert isinstance(unroutable, LtmUnroutableError), unroutable
        assert unroutable.routing_key == "tool.create_long_term_memory"  # after the shard's own key came back
        too_large = await outcome(client, arguments={"memory_content": "x" * 300_000})
        assert isinstance(too_large, LtmEventTooLargeError)
        assert too_large.size > 300_000
        upper = await outcome(client, event_id=str(uuid.uuid4()).upper())
        assert isinstance(upper, InvalidEventError)
        assert "canonical form" in str(upper)
        bad_context = await outcome(client, context={**context(7), "channel_disc_id": "not-an-id"})
        assert isinstance(bad_context, InvalidEventError)
        assert client.in_flight == 0
    finally:
        await client.close()
    closed = await outcome(client)
    assert isinstance(closed, LtmClosedError)


async def test_the_subscriber_resubscribes_after_a_redis_restart(tmp_path: Path) -> None:
    redis = await PrivateRedis(find_redis_server(), tmp_path).start()
    resubscribed = asyncio.Event()
    states: list[ServerStateInvalidation] = []
    subscriber = await InvalidationSubscriber.start(
        redis.url, on_server_state=states.append, on_resubscribed=resubscribed.set, max_reconnect_delay=0.5
    )
    publisher: Any = None
    try:
        assert subscriber.subscription_count == 1
        await redis.restart()
        await asyncio.wait_for(resubscribed.wait(), WAIT)
        assert subscriber.subscription_count == 2
        import redis.asyncio as aioredis

        publisher = aioredis.Redis.from_url(redis.url)
        event_id = uuid.uuid4()
        message = {
            "schema_version": 1,
            "invalidation_id": invalidation_id_of(event_id),
            "kind": "tomori_state",
            "server_disc_id": GUILD,
        }
        await publisher.publish("tomori:cache-invalidation", json.dumps(message))
        await publisher.publish("tomori:cache-invalidation", b"not json")
        await eventually(lambda: len(states) == 1, "the invalidation after the restart")
        assert states[0].invalidation_id == invalidation_id_of(str(event_id))
    finally:
        await subscriber.close()
        if publisher is not None:
            await publisher.aclose()
        redis.close()
