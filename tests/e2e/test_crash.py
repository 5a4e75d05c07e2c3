"""A worker killed without warning mid-stream: its unacked events are redelivered to the next worker and
answered from the ledger when they had committed; nothing is lost, nothing saved twice."""

from __future__ import annotations

import signal

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
from tests.support.harness import Shard

pytestmark = pytest.mark.e2e

EVENTS = 1000
KILL_AFTER = 300


@pytest.mark.pgbouncer
async def test_sigkill_mid_stream_loses_and_duplicates_nothing(stack: Stack) -> None:
    server_scopes, personal_scopes = await seed_scopes(stack.rows)
    stream = build_stream(EVENTS, server_scopes, personal_scopes, seed=11)
    first = stack.worker(**limit_env())
    await first.wait_for_log("consuming")

    async with Shard(stack.rabbitmq_url) as shard:
        await shard.publish_many(stream.bodies)
        await wait_for_count(shard, KILL_AFTER, timeout=60)
        first.kill()  # SIGKILL to the process group: no drain, no acks, no goodbye
        assert first.proc is not None
        assert first.proc.returncode == -signal.SIGKILL
        answered_before = len(shard.received.results)
        assert answered_before < EVENTS, "the stream finished before the kill; the test proves nothing"

        second = stack.worker(**limit_env())
        # consuming before it is stopped: on a busy machine the first worker's last results may arrive only
        # now, and a SIGTERM to a worker still starting up ends it as the signal's default does (-15)
        await second.wait_for_log("consuming", timeout=60)
        await wait_for_results(shard, stream.event_ids, timeout=90, workers=[second])
        second.signal(signal.SIGTERM)
        assert await second.wait_exit(timeout=30) == 0
        await shard.settle()

    # every event answered (the first worker is dead: the second took over the rest, and re-answered
    # from the ledger what had committed unacked), one memory per saving event, limits exact
    statuses = await check_outcome(stack.rows.conn, stream, shard.received)
    assert statuses[Status.SAVED] > 0
