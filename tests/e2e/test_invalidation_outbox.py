"""Redis unreachable for longer than the whole retry budget, under a stream of events: every event is
answered once (no retry, no second result, nothing dead-lettered), and every saved memory's invalidation
reaches Redis once it answers again, through the outbox in Postgres.

Only the worker loses Redis (a cuttable TCP proxy in front of it); the test's own listener stays subscribed
to the real server, so it sees exactly what the worker publishes and when.
"""

from __future__ import annotations

import asyncio
import signal
import time
from urllib.parse import urlsplit

import pytest

from contracts.models import Status
from tests.e2e.stack import Stack
from tests.e2e.workload import (
    build_stream,
    check_outcome,
    limit_env,
    seed_scopes,
    wait_for_count,
    wait_for_results,
)
from tests.support.harness import InvalidationListener, Shard, metric
from tests.support.outages import slow_down
from tests.support.proxy import CuttableProxy
from tests.support.wait import holds_within
from worker.testing.workers import free_port

pytestmark = pytest.mark.e2e

EVENTS = 400
#: the stack's retry settings (200 ms doubling to 1 s, 5 attempts) add up to 2.4 s of delays
RETRY_BUDGET_S = 0.2 + 0.4 + 0.8 + 1.0
OUTAGE_S = 3 * RETRY_BUDGET_S


@pytest.mark.slow
async def test_redis_down_longer_than_the_retry_budget_answers_once_and_invalidates_later(
    stack: Stack,
) -> None:
    scopes = await seed_scopes(stack.rows)
    await slow_down(stack.rows.conn, "ltm_processed_events", 0.02)  # the stream outlasts the outage's start
    stream = build_stream(EVENTS, *scopes, seed=31)
    parts = urlsplit(stack.redis_url)
    proxy = await CuttableProxy(parts.hostname or "127.0.0.1", parts.port or 6379).start()
    port = free_port()
    worker = stack.worker(
        LTM_REDIS_URL=proxy.url(stack.redis_url),
        LTM_HTTP_PORT=str(port),
        LTM_CONCURRENCY="8",
        LTM_PREFETCH="16",
        **limit_env(),
    )
    await worker.wait_for_log("consuming")
    try:
        async with Shard(stack.rabbitmq_url) as shard, InvalidationListener(stack.redis_url) as listener:
            await shard.publish_many(stream.bodies)
            await wait_for_count(shard, EVENTS // 5, timeout=60)
            await proxy.cut()
            answered_at_cut = len(shard.received.results)
            await asyncio.sleep(OUTAGE_S)
            answered_during = len(shard.received.results) - answered_at_cut
            deferred = await metric(port, "ltm_invalidations_deferred_total")
            pending_during = await stack.rows.conn.fetchval(
                "SELECT count(*) FROM ltm_processed_events WHERE invalidation_pending_since IS NOT NULL"
            )
            await proxy.restore()
            restored_at = time.monotonic()
            await wait_for_results(shard, stream.event_ids, timeout=90, workers=[worker])
            saved = [e for e in stream.event_ids if shard.received.results[e][0]["status"] == Status.SAVED]
            await holds_within(lambda: all(listener.of(e) for e in saved), timeout=30)
            flushed_in = time.monotonic() - restored_at
            await asyncio.sleep(0.5)  # a late duplicate invalidation would arrive in this time
            worker.signal(signal.SIGTERM)
            assert await worker.wait_exit(timeout=30) == 0
            await shard.settle()
    finally:
        await proxy.close()

    assert answered_at_cut < EVENTS, "the stream finished before the outage; the test proves nothing"
    # the outage did not hold the stream: events kept being answered while Redis was away
    assert answered_during > 0
    assert deferred > 0
    assert pending_during > 0
    statuses = await check_outcome(stack.rows.conn, stream, shard.received, exactly_once=True)
    assert statuses[Status.SAVED] == len(saved) > 0
    lost = [e for e in saved if not listener.of(e)]
    assert not lost, f"{len(lost)} of {len(saved)} invalidations never reached Redis"
    # (other tests may publish on the same channel: only this stream's events count)
    unsaved = set(stream.event_ids) - set(saved)
    assert not [e for e in unsaved if listener.of(e)], "an invalidation for an event that saved nothing"
    assert (
        await stack.rows.conn.fetchval(
            "SELECT count(*) FROM ltm_processed_events WHERE invalidation_pending_since IS NOT NULL"
        )
        == 0
    )
    assert worker.count("transient fault; retrying later") == 0
    assert worker.count("transient fault outlasted every retry; dead-lettered") == 0
    assert worker.count("redis answers again; pending invalidations published") >= 1
    print(
        f"{EVENTS} events, Redis cut for {OUTAGE_S:.1f} s: {answered_during} answered during the cut, "
        f"{int(deferred)} invalidations deferred ({pending_during} pending mid-cut), "
        f"all {len(saved)} published "
        f"{flushed_in:.2f} s after Redis returned; 0 retries, 0 dead letters, {len(stream)} results"
    )
