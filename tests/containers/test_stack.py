"""The shipped test stack (worker.testing.stack) for real: two workers on the three services, ready when it
says so, a shard's save answered with a result, a notice and an invalidation, shards confined to their own
keys, reuse by the next test fast, and a start that fails carrying the logs and leaving nothing behind.

Prints the stack's start time and a second test's reuse time (docs/testing-your-shard.md quotes them).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator

import aio_pika
import aiormq
import asyncpg
import pytest
import redis.asyncio as aioredis
import redis.exceptions

from tests.containers.test_service_containers import our_containers
from worker.testing.stack import EXCHANGES, LtmShard, LtmStack, StackError

pytestmark = pytest.mark.usefixtures("docker_engine")

WAIT = 60.0
INVALIDATIONS = "tomori:cache-invalidation"


@pytest.fixture(scope="module")
def stack(docker_engine: None) -> Iterator[LtmStack]:
    try:
        started = LtmStack.start(workers=2)
    except StackError as error:
        pytest.fail(str(error), pytrace=False)
    phases = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in started.timings.items())
    took = f"{started.start_seconds:.1f} s"
    print(f"\nthe LTM test stack (3 containers, migrate, 2 workers) started in {took}: {phases}")
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def shard(stack: LtmStack) -> Iterator[LtmShard]:
    access = stack.shard()
    try:
        yield access
    finally:
        stack.release(access)


@pytest.fixture
async def channel(shard: LtmShard) -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    connection = await aio_pika.connect(shard.amqp_url, timeout=10)
    try:
        yield await connection.channel(publisher_confirms=True)
    finally:
        await connection.close()


async def shard_queues(
    channel: aio_pika.abc.AbstractChannel, shard: LtmShard
) -> tuple[aio_pika.abc.AbstractQueue, aio_pika.abc.AbstractQueue]:
    """The shard's side of CONTRACT.md section 2, as the shard's own user."""
    results = await channel.declare_queue(shard.results_queue, durable=True)
    await results.bind("tomori.tool_results", routing_key=f"shard.{shard.shard_id}")
    notices = await channel.declare_queue(shard.notifications_queue, durable=True)
    await notices.bind("tomori.notifications", routing_key=f"shard.{shard.shard_id}")
    return results, notices


async def next_body(queue: aio_pika.abc.AbstractQueue) -> dict[str, object]:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        message = await queue.get(fail=False, timeout=10)
        if message is not None:
            await message.ack()
            body: dict[str, object] = json.loads(message.body)
            return body
        await asyncio.sleep(0.1)
    raise AssertionError(f"nothing arrived in {queue.name} within {WAIT:.0f} s")


async def test_ports_on_loopback_and_redis_users_that_confine_a_shard(
    stack: LtmStack, shard: LtmShard
) -> None:
    """Security review 4: every port asked to be published on 127.0.0.1 (the request, not the result, which an
    engine run with --ip 127.0.0.1 narrows anyway; N12), and Redis's users (N10): the shard's may subscribe
    and ping but neither publish an invalidation nor read a key; without credentials nothing."""
    for service in (stack.postgres, stack.rabbitmq, stack.redis):
        wrapped = service.container.handle.get_wrapped_container()
        wrapped.reload()
        requested = wrapped.attrs["HostConfig"]["PortBindings"]
        assert {binding["HostIp"] for bindings in requested.values() for binding in bindings} == {"127.0.0.1"}
    client = aioredis.from_url(shard.redis_url)
    try:
        assert await client.ping()
        with pytest.raises(redis.exceptions.NoPermissionError):
            await client.publish(INVALIDATIONS, b"{}")
        with pytest.raises(redis.exceptions.NoPermissionError):
            await client.get("any-key")
    finally:
        await client.aclose()
    address = shard.redis_url.rpartition("@")[2]
    anonymous = aioredis.from_url(f"redis://{address}")
    try:
        with pytest.raises(redis.exceptions.AuthenticationError):
            await anonymous.ping()
    finally:
        await anonymous.aclose()


def test_the_stack_is_ready_when_start_returns(stack: LtmStack) -> None:
    api = stack.management
    assert set(EXCHANGES) <= api.exchanges("/")
    assert api.queue("/", "ltm.create_memory")["consumers"] == 2
    assert all(worker.ready() for worker in stack.workers)
    assert all(worker.process.poll() is None for worker in stack.workers)


async def test_a_shard_save_gets_its_result_notice_and_invalidation(
    shard: LtmShard, channel: aio_pika.abc.AbstractChannel
) -> None:
    results, notices = await shard_queues(channel, shard)
    try_out = await shard.seed()
    event = try_out.event(
        {"memory_content": "{user} likes dogs", "memory_scope": "server_wide"}, shard_id=shard.shard_id
    )
    redis = aioredis.from_url(shard.redis_url)
    pubsub = redis.pubsub()
    await pubsub.subscribe(INVALIDATIONS)
    try:
        tool_calls = await channel.get_exchange("tomori.tool_calls", ensure=False)
        await tool_calls.publish(
            aio_pika.Message(json.dumps(event).encode(), message_id=event["event_id"]),
            routing_key="tool.create_long_term_memory",
            mandatory=True,
        )
        result = await next_body(results)
        notice = await next_body(notices)
        invalidation = None
        deadline = time.monotonic() + WAIT
        while invalidation is None and time.monotonic() < deadline:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if message is not None:
                body = json.loads(message["data"])
                if body.get("server_disc_id") == try_out.guild_disc_id:
                    invalidation = body
    finally:
        await pubsub.aclose()
        await redis.aclose()

    assert result["event_id"] == event["event_id"]
    assert result["status"] == "memory_saved_successfully"
    assert notice["event_id"] == event["event_id"]
    assert invalidation is not None
    assert invalidation["kind"] == "tomori_state"
    connection = await asyncpg.connect(shard.postgres_dsn)
    try:
        saved = await connection.fetchval(
            "SELECT content FROM server_memories WHERE server_id = $1", try_out.server_id
        )
    finally:
        await connection.close()
    assert saved == "{user} likes dogs"


async def test_a_shard_user_may_not_bind_another_shards_key(
    shard: LtmShard, channel: aio_pika.abc.AbstractChannel
) -> None:
    results = await channel.declare_queue(shard.results_queue, durable=True)
    with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
        await results.bind("tomori.tool_results", routing_key=f"shard.{shard.shard_id + 1000}")


async def test_a_second_test_reuses_the_stack_in_well_under_a_second(stack: LtmStack) -> None:
    """What a test costs on a started stack: its own shard user, a seeded guild, the user deleted again."""
    figures = []
    for _ in range(5):
        began = time.monotonic()
        access = stack.shard()
        await access.seed()
        stack.release(access)
        figures.append(time.monotonic() - began)
    print(
        f"\nreuse per test (shard user + seeded guild + release): {', '.join(f'{f:.3f}' for f in figures)} s"
    )
    # a shard id is never handed out twice on one stack
    shards = [stack.shard() for _ in range(3)]
    assert len({access.shard_id for access in shards}) == 3
    for access in shards:
        stack.release(access)


def test_a_stack_whose_workers_never_get_ready_fails_at_its_deadline_with_every_log() -> None:
    """The workers' Redis is a closed port: they wait for it at start-up, so the one deadline passes; the
    error carries the containers' logs and the worker's, and nothing is left running."""
    before = our_containers()
    began = time.monotonic()
    with pytest.raises(StackError) as raised:
        LtmStack.start(worker_env={"LTM_REDIS_URL": "redis://127.0.0.1:1/0"}, timeout=60)
    took = time.monotonic() - began
    message = str(raised.value)
    assert "not ready within 60 s" in message
    assert "/readyz of worker 0 does not say ready" in message
    for section in ("--- Postgres (", "--- RabbitMQ (", "--- Redis (", "--- worker 0 ("):
        assert section in message
    assert "127.0.0.1:1" in message.split("--- worker 0 (", 1)[1]  # the worker's own log names its Redis
    assert left_behind(before) == set()
    print(f"\na stack whose workers never got ready gave up after {took:.1f} s (deadline 60 s)")


def left_behind(before: set[str]) -> set[str]:
    """Containers of worker.testing not there `before` that are still there after up to 30 s (a start given
    up mid-way removes its container when the engine's call returns)."""
    deadline = time.monotonic() + 30
    while (extra := our_containers() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    return extra


def test_a_missing_image_fails_the_stack_at_once_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LTM_REDIS_IMAGE", "does-not-exist:1")
    before = our_containers()
    began = time.monotonic()
    with pytest.raises(StackError) as raised:
        LtmStack.start(timeout=120)
    took = time.monotonic() - began
    message = str(raised.value)
    print(f"\na stack with a missing image gave up after {took:.1f} s")
    assert "does-not-exist:1" in message
    assert "LTM_REDIS_IMAGE" in message
    assert "abandoned" not in message  # the others' give-ups are not the reason
    assert took < 60
    assert left_behind(before) == set()
