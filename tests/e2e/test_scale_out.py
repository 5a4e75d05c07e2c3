"""Competing consumers: several worker processes on one queue answer every event once, limits exact."""

from __future__ import annotations

import signal

import pytest

from contracts.models import Status
from tests.e2e.stack import Stack
from tests.e2e.workload import (
    build_stream,
    check_outcome,
    limit_env,
    processed_counts,
    seed_scopes,
    wait_for_results,
)
from tests.support.harness import Shard

pytestmark = pytest.mark.e2e

EVENTS = 2000


@pytest.mark.pgbouncer
@pytest.mark.parametrize("workers", [2, 4])
async def test_workers_share_a_stream_without_duplicates_or_overshoot(stack: Stack, workers: int) -> None:
    server_scopes, personal_scopes = await seed_scopes(stack.rows)
    stream = build_stream(EVENTS, server_scopes, personal_scopes)
    processes = [stack.worker(**limit_env(), LTM_POSTGRES_POOL_SIZE="5") for _ in range(workers)]
    await stack.workers_ready()

    async with Shard(stack.rabbitmq_url) as shard:
        await shard.publish_many(stream.bodies)
        await wait_for_results(shard, stream.event_ids, timeout=120, workers=processes)
        # stop the workers cleanly, then collect anything still on its way: a duplicate would show now
        for process in processes:
            process.signal(signal.SIGTERM)
        for process in processes:
            assert await process.wait_exit(timeout=30) == 0
        await shard.settle()

    statuses = await check_outcome(stack.rows.conn, stream, shard.received, exactly_once=True)
    assert statuses[Status.SAVED] > 0, statuses
    assert statuses[Status.LIMIT_EXCEEDED] > 0, statuses

    # every process took part, and together they processed each event exactly once
    counts = processed_counts(processes)
    assert all(count > 0 for count in counts.values()), counts
    assert sum(counts.values()) == EVENTS, counts
