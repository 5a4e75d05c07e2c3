"""A dependency fails under a running worker mid-stream: the worker rides it out, the stream finishes,
nothing is lost and nothing is saved twice.

Processing is slowed down for real (a ``pg_sleep`` trigger on the event ledger) so the stream is still
running when the fault hits. The faults hit servers of the test's own (tests/support/outages.py): the broker
tests stop the app of the session's private RabbitMQ node, every test here gets a ``redis-server`` of its
own, and only the test database's connections are cut. The machine's services are never touched.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from datetime import datetime

import pytest
import redis.asyncio as aioredis

from contracts.models import Status
from tests.e2e.cluster import RabbitCluster, rabbitmq_stopped
from tests.e2e.stack import Stack
from tests.e2e.workload import (
    Scope,
    Stream,
    build_stream,
    check_outcome,
    limit_env,
    seed_scopes,
    wait_for_count,
    wait_for_results,
)
from tests.factories import event_body
from tests.support.harness import INVALIDATION_CHANNEL, InvalidationListener, Shard, invalidation_key
from tests.support.outages import PrivateRedis, slow_down, terminate_backends
from tests.support.wait import holds_within
from worker.runtime.backoff import CAP_SECONDS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EVENTS = 400
#: every event takes at least this long in Postgres: 400 events at concurrency 8 last ~2.5 s or more
CLAIM_DELAY_S = 0.05
SLOW = {"LTM_CONCURRENCY": "8", "LTM_PREFETCH": "16", **limit_env()}


@pytest.fixture
def redis_url(private_redis: PrivateRedis) -> str:
    """This file's stacks use a Redis of the test's own: one test restarts it."""
    return private_redis.url


async def _slow_scopes(stack: Stack) -> tuple[list[Scope], list[Scope]]:
    scopes = await seed_scopes(stack.rows)
    await slow_down(stack.rows.conn, "ltm_processed_events", CLAIM_DELAY_S)
    return scopes


async def test_rabbitmq_stopped_and_started_mid_stream(
    private_broker: RabbitCluster, private_broker_stack: Stack
) -> None:
    stack = private_broker_stack
    stream = build_stream(EVENTS, *await _slow_scopes(stack), seed=21)
    worker = stack.worker(**SLOW)
    await worker.wait_for_log("consuming")

    async with Shard(stack.rabbitmq_url) as shard:
        await shard.publish_many(stream.bodies)
        await wait_for_count(shard, EVENTS // 5, timeout=60)
        async with rabbitmq_stopped(private_broker):
            await worker.wait_for_log("rabbitmq connection lost; reconnecting", timeout=30)
            answered_during = len(shard.received.results)
            # the outage lasts until the worker has tried the broker again (and found it down)
            await worker.wait_for_log("rabbitmq unavailable", timeout=30)
        assert answered_during < EVENTS, "the stream finished before the outage; the test proves nothing"
        await worker.wait_for_log("consuming", at_least=2, timeout=60)
        await wait_for_results(shard, stream.event_ids, timeout=90, workers=[worker])
        worker.signal(signal.SIGTERM)
        assert await worker.wait_exit(timeout=30) == 0
        await shard.settle()

    statuses = await check_outcome(stack.rows.conn, stream, shard.received)
    assert statuses[Status.SAVED] > 0
    assert worker.count("rabbitmq unavailable") >= 1  # it did try while the broker was down


def _logged_at(line: dict[str, object]) -> float:
    return datetime.fromisoformat(str(line["timestamp"]).replace("Z", "+00:00")).timestamp()


async def test_workers_reconnect_promptly_and_out_of_step_after_a_broker_restart(
    private_broker: RabbitCluster, private_broker_stack: Stack
) -> None:
    """Two idle workers lose the broker until each has tried it three times: each tries again within the
    backoff cap (3 s), at jittered moments, and consumes again soon after the broker is back. Prints the
    recovery times."""
    stack = private_broker_stack
    workers = [stack.worker(), stack.worker()]
    await stack.workers_ready()
    async with rabbitmq_stopped(private_broker):
        for worker in workers:
            await worker.wait_for_log("rabbitmq connection lost; reconnecting", timeout=30)
        for worker in workers:
            await worker.wait_for_log("rabbitmq unavailable", at_least=3, timeout=60)
    back_at = time.time()
    for worker in workers:
        await worker.wait_for_log("consuming", at_least=2, timeout=30)

    recoveries = []
    for worker in workers:
        lines = worker.lines()
        tries = [line for line in lines if line.get("event") == "rabbitmq unavailable"]
        assert len(tries) >= 3, "the worker should have kept trying while the broker was down"
        waits = [float(line["retry_in_s"]) for line in tries]
        assert max(waits) <= CAP_SECONDS
        # drawn at random and logged to 0.01 s, two waits of one worker may repeat by chance (CI saw
        # [0.9, 1.62, 2.94, 1.62]); a worker waiting one fixed delay would repeat every time. That the two
        # workers are out of step is checked below.
        assert len(set(waits)) > 1, f"waits not jittered: {waits}"
        consuming = [line for line in lines if line.get("event") == "consuming"][-1]
        recoveries.append(_logged_at(consuming) - back_at)
    first_waits = [
        [float(x["retry_in_s"]) for x in w.lines() if x.get("event") == "rabbitmq unavailable"]
        for w in workers
    ]
    assert first_waits[0] != first_waits[1], "both workers retried in step"
    print(f"recovery after the broker answered: {', '.join(f'{r:.2f} s' for r in recoveries)}")
    # the same stream still works on both
    world = await stack.rows.world()
    async with Shard(stack.rabbitmq_url) as shard:
        bodies = [
            event_body(
                {"memory_content": f"after {i}", "memory_scope": "server_wide"}, persona_id=world.persona_id
            )
            for i in range(20)
        ]
        await shard.publish_many(bodies)
        await shard.wait_for_results([b["event_id"] for b in bodies], timeout=30)


async def test_postgres_connections_terminated_mid_stream(stack: Stack) -> None:
    stream = build_stream(EVENTS, *await _slow_scopes(stack), seed=22)
    worker = stack.worker(**SLOW)
    await worker.wait_for_log("consuming")

    async with Shard(stack.rabbitmq_url) as shard:
        await shard.publish_many(stream.bodies)
        terminated = 0
        for round_ in range(1, 6):
            await wait_for_count(shard, round_ * EVENTS // 8, timeout=60)
            terminated += await terminate_backends(stack.rows.conn)
        assert len(shard.received.results) < EVENTS, "the stream finished early; the test proves nothing"
        await wait_for_results(shard, stream.event_ids, timeout=90, workers=[worker])
        worker.signal(signal.SIGTERM)
        assert await worker.wait_exit(timeout=30) == 0
        await shard.settle()

    assert terminated > 0
    statuses = await check_outcome(stack.rows.conn, stream, shard.received)
    assert statuses[Status.SAVED] > 0
    # the cuts hit events in flight, and those went round the retry queue instead of failing
    assert worker.count("transient fault; retrying later") >= 1
    assert worker.count("transient fault outlasted every retry; dead-lettered") == 0


async def _listener_subscribed(redis_url: str, listener: InvalidationListener, timeout: float = 30) -> None:
    """Publish probes until the listener receives one: it is subscribed (again) from then on."""
    probe = f"probe-{uuid.uuid4()}"
    client = aioredis.Redis.from_url(redis_url)
    deadline = time.monotonic() + timeout
    try:
        while not listener.messages.get(probe):
            assert time.monotonic() < deadline, f"the invalidation listener did not resubscribe in {timeout}s"
            await client.publish(INVALIDATION_CHANNEL, json.dumps({"invalidation_id": probe}))
            await asyncio.sleep(0.1)
    finally:
        await client.aclose()


async def test_redis_restarted_mid_stream(stack: Stack, private_redis: PrivateRedis) -> None:
    scopes = await _slow_scopes(stack)
    stream = build_stream(EVENTS, *scopes, seed=23)
    after = build_stream(100, *scopes, seed=24)
    worker = stack.worker(**SLOW)
    await worker.wait_for_log("consuming")

    async with Shard(stack.rabbitmq_url) as shard, InvalidationListener(stack.redis_url) as listener:
        await shard.publish_many(stream.bodies)
        await wait_for_count(shard, EVENTS // 4, timeout=60)
        # down long enough to outlast the worker's in-place retries, well within its retry queues
        await private_redis.restart(down_for=1.5)
        assert len(shard.received.results) < EVENTS, "the stream finished early; the test proves nothing"
        await _listener_subscribed(stack.redis_url, listener)
        # events published now are processed after the restart: each save's invalidation must arrive
        await shard.publish_many(after.bodies)
        await wait_for_results(shard, stream.event_ids + after.event_ids, timeout=90, workers=[worker])
        worker.signal(signal.SIGTERM)
        assert await worker.wait_exit(timeout=30) == 0
        await shard.settle()
        saved_after = [e for e in after.event_ids if shard.received.results[e][0]["status"] == Status.SAVED]
        await holds_within(lambda: all(listener.of(e) for e in saved_after), timeout=10)

    both = Stream(stream.bodies + after.bodies, {**stream.scope_of, **after.scope_of})
    statuses = await check_outcome(stack.rows.conn, both, shard.received)
    assert statuses[Status.SAVED] > 0
    assert saved_after, "no event after the restart saved a memory; the test proves nothing"
    lost = [e for e in saved_after if not listener.of(e)]
    assert not lost, f"{len(lost)} of {len(saved_after)} invalidations after the restart never arrived"
    for event_id in saved_after:
        scope = after.scope_of[event_id]
        assert scope is not None
        expected = (
            {"kind": "tomori_state", "server_disc_id": scope.guild}
            if scope.kind == "server"
            else {"kind": "user", "user_disc_id": scope.target_disc_id}
        )
        for message in listener.of(event_id):
            assert message == {"schema_version": 1, "invalidation_id": invalidation_key(event_id), **expected}
    # the outage hit saves in flight: their invalidations waited in the outbox (Postgres) instead of the
    # events going round the retry queue or to the dead-letter queue
    assert worker.count("redis unavailable; invalidations are kept in postgres until it answers") >= 1
    assert worker.count("transient fault; retrying later") == 0
    assert worker.count("transient fault outlasted every retry; dead-lettered") == 0
