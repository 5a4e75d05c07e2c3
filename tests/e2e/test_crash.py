"""A worker killed without warning mid-stream: its unacked events are redelivered to the next worker and
answered from the ledger when they had committed; nothing is lost, nothing saved twice. Unreadable events in
the same stream are dead-lettered while the worker dies: each is in the DLQ and kept in Postgres as waiting
(`worker dlq check` agrees), none lost on the way from the copies queue to the table."""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

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
from tests.support.harness import Shard, queue_depth
from tests.support.wait import eventually

pytestmark = pytest.mark.e2e

EVENTS = 1000
KILL_AFTER = 300
#: unreadable events among the stream: dead-lettered at once, their copies kept by the keepers
UNREADABLE = 150


@pytest.mark.pgbouncer
async def test_sigkill_mid_stream_loses_and_duplicates_nothing(stack: Stack) -> None:
    server_scopes, personal_scopes = await seed_scopes(stack.rows)
    stream = build_stream(EVENTS, server_scopes, personal_scopes, seed=11)
    first = stack.worker(**limit_env())
    await first.wait_for_log("consuming")

    async with Shard(stack.rabbitmq_url) as shard:
        unreadable = [f"not json {n}".encode() for n in range(UNREADABLE)]
        every = len(stream.bodies) // UNREADABLE
        mixed: list[dict[str, Any] | bytes] = []
        for n, body in enumerate(stream.bodies):
            mixed.append(body)
            if n % every == 0 and unreadable:
                mixed.append(unreadable.pop())
        mixed.extend(unreadable)
        await shard.publish_many(mixed)
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
        # the unreadable events have no result to wait for: each a dead letter, kept by the second worker
        await eventually(lambda: all_kept(stack), "every unreadable event dead-lettered and kept", 60)
        second.signal(signal.SIGTERM)
        assert await second.wait_exit(timeout=30) == 0
        await shard.settle()

    # every event answered (the first worker is dead: the second took over the rest, and re-answered
    # from the ledger what had committed unacked), one memory per saving event, limits exact
    statuses = await check_outcome(stack.rows.conn, stream, shard.received)
    assert statuses[Status.SAVED] > 0

    # every unreadable event is a dead letter (twice at most: dead-lettered, then killed before its ack),
    # and every dead letter in the DLQ is kept in Postgres as waiting, once
    checked = await asyncio.to_thread(stack.cli, "dlq", "check", "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    found = json.loads(checked.stdout)
    assert found["agree"] is True, found
    assert UNREADABLE <= found["in_dlq"] == found["waiting"] <= 2 * UNREADABLE, found
    assert found["copies_waiting"] == 0


async def all_kept(stack: Stack) -> bool:
    """Every unreadable event in the DLQ, and each letter in it kept (the keepers' copies all written)."""
    dlq = await queue_depth(stack.rabbitmq_url, "ltm.create_memory.dlq")
    kept = await stack.rows.conn.fetchval("SELECT count(*) FROM ltm_dead_letters WHERE state = 'waiting'")
    return bool(dlq >= UNREADABLE and kept == dlq)
