"""SIGTERM with events in flight: the worker stops taking events, finishes (and acks) the ones it is on
within the grace period, exits 0; what it had not started is requeued for the next worker. When the grace
period runs out, the ones still running are abandoned (rolled back, requeued) and it still exits 0. A
second signal exits at once, and the next worker answers whatever was left unacked.

Events are held in flight for real: a trigger on ``server_memories`` stops every save inside its
transaction (scope lock held) until the test opens the gate, so "in flight" is a fact, not a race. The
worker writes the events that are ready together: the gate holds its batches, and the worker's
``ltm_events_in_flight`` says when every slot is taken (by an event at the gate, or one waiting for
the batch at the gate to come back).
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Self

import pytest

from contracts.models import Status
from tests.e2e.cluster import RabbitCluster, rabbitmq_stopped
from tests.e2e.stack import Stack
from tests.e2e.workload import (
    Stream,
    check_outcome,
    limit_env,
    round_robin,
    seed_scopes,
    wait_for_results,
)
from tests.support.harness import Shard, WorkerProcess, metric, wait_for_metric
from tests.support.outages import Gate, frozen_backends
from worker.testing.workers import free_port

pytestmark = pytest.mark.e2e

EVENTS = 40
CONCURRENCY = 4
#: events of one shard in process at once: every slot but the one kept for another shard (docs/fair-shares.md)
HELD = CONCURRENCY - 1
STOPPING = "stopping: no new events; finishing the ones in flight"
PROCESSED = "event processed"


def _env(grace_s: int) -> dict[str, str]:
    return {
        "LTM_CONCURRENCY": str(CONCURRENCY),
        "LTM_PREFETCH": str(2 * CONCURRENCY),
        "LTM_SHUTDOWN_GRACE_SECONDS": str(grace_s),
        **limit_env(),
    }


class PipedWorker(WorkerProcess):
    """``worker run`` writing its log into a pipe, as into ``| head -2`` or a log shipper: the test reads
    the first lines (copied to the log file) and then closes its end, as ``head`` does once it has them."""

    reader: int | None = None

    def start(self, *extra: str) -> Self:
        read_end, write_end = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module, *self.args, *extra],
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        os.close(write_end)
        self.reader = read_end
        return self

    def read_until(self, event: str, timeout: float = 60.0) -> None:
        """Read the pipe (into the log file) until a line with ``event`` came through (blocking)."""
        assert self.reader is not None
        deadline = time.monotonic() + timeout
        pending = b""
        with self.log_path.open("ab") as log:
            while time.monotonic() < deadline:
                self.check_alive()
                ready, _, _ = select.select([self.reader], [], [], 0.2)
                if not ready:
                    continue
                chunk = os.read(self.reader, 65536)
                log.write(chunk)
                log.flush()
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    try:
                        if json.loads(line).get("event") == event:
                            return
                    except ValueError:
                        continue
        raise AssertionError(f"{self.name} did not write {event!r} into its pipe within {timeout}s")

    def reader_exits(self) -> None:
        """Close the pipe's only read end: every later write of the worker fails with EPIPE."""
        assert self.reader is not None
        os.close(self.reader)
        self.reader = None


async def _events_held_in_flight(
    stack: Stack, shard: Shard, grace_s: int
) -> tuple[Stream, Gate, WorkerProcess]:
    """A worker with every slot taken by a save waiting at the closed gate (and more events queued).

    "Waiting at the gate" is checked for every batch: all the in-flight events are in batches that have
    started, and each of those batches waits on a lock. A batch still between its read and its write
    when a test freezes Postgres could send its write after the worker has given up on it."""
    server_scopes, _ = await seed_scopes(stack.rows)
    stream = round_robin(EVENTS, server_scopes)  # six scopes, none full: every event is a save
    gate = Gate(stack.rows.conn, "server_memories")
    await gate.close()
    port = free_port()
    worker = stack.worker(**_env(grace_s), LTM_HTTP_PORT=str(port))
    await worker.wait_for_log("consuming")
    await shard.publish_many(stream.bodies)
    await wait_for_metric(port, f"ltm_events_in_flight {float(HELD)}")
    await wait_for_metric(port, f"ltm_db_batch_size_sum {float(HELD)}")
    await gate.wait_for_waiters(int(await metric(port, "ltm_db_batch_size_count")))
    return stream, gate, worker


async def _second_worker_finishes(stack: Stack, shard: Shard, stream: Stream) -> WorkerProcess:
    second = stack.worker(**_env(10))
    await second.wait_for_log("consuming", timeout=60)  # a SIGTERM while it starts would end it with -15
    await wait_for_results(shard, stream.event_ids, timeout=60, workers=[second])
    second.signal(signal.SIGTERM)
    assert await second.wait_exit(timeout=15) == 0
    await shard.settle()
    return second


def _lines_after(worker: WorkerProcess, event: str) -> list[dict[str, object]]:
    lines = worker.lines()
    start = next(i for i, line in enumerate(lines) if line.get("event") == event)
    return lines[start + 1 :]


@pytest.mark.pgbouncer
async def test_sigterm_finishes_in_flight_events_and_exits_zero(stack: Stack) -> None:
    grace_s = 10
    async with Shard(stack.rabbitmq_url) as shard:
        stream, gate, first = await _events_held_in_flight(stack, shard, grace_s)
        signalled = time.monotonic()
        first.signal(signal.SIGTERM)
        await first.wait_for_log(STOPPING, timeout=5)
        await gate.open()  # the in-flight saves may now finish, during the drain
        assert await first.wait_exit(timeout=grace_s + 5) == 0
        assert time.monotonic() - signalled < grace_s

        # exactly the events in flight were finished and acked, after the signal; then a clean stop
        [stopping] = [line for line in first.lines() if line.get("event") == STOPPING]
        assert stopping["in_flight"] >= HELD
        drained = [line for line in _lines_after(first, STOPPING) if line.get("event") == PROCESSED]
        assert len(drained) == HELD, drained
        assert first.count(PROCESSED) == HELD
        assert first.count("stopped cleanly") == 1
        assert first.count("grace period over: in-flight events are requeued") == 0

        second = await _second_worker_finishes(stack, shard, stream)

    # finished events were acked (never redelivered, never replayed); the rest went to the second worker
    statuses = await check_outcome(stack.rows.conn, stream, shard.received, exactly_once=True)
    assert statuses[Status.SAVED] == EVENTS
    assert second.count(PROCESSED) == EVENTS - HELD


async def test_a_worker_whose_log_reader_went_away_still_drains_and_exits_on_sigterm(stack: Stack) -> None:
    """Newcomer review 4, F1: ``worker run | head -2``. Once the reader is gone, every log line fails with
    EPIPE; the signal handler's own line used to raise before the stop was set, so SIGTERM (and a second
    one) was ignored and the worker went on consuming until SIGKILL. Now the stop comes first and a failed
    log write is dropped: the events in flight are finished and acked within the grace period, exit 0, and
    the rest is requeued for the next worker (nothing lost, nothing answered twice)."""
    grace_s = 10
    server_scopes, _ = await seed_scopes(stack.rows)
    stream = round_robin(EVENTS, server_scopes)
    gate = Gate(stack.rows.conn, "server_memories")
    await gate.close()
    port = free_port()
    first = PipedWorker(stack.env(**_env(grace_s), LTM_HTTP_PORT=str(port)), stack.log_dir / "piped.log")
    stack.workers.append(first.start())  # the stack's teardown kills it, whatever happens here
    await asyncio.to_thread(first.read_until, "consuming")
    first.reader_exits()
    async with Shard(stack.rabbitmq_url) as shard:
        await shard.publish_many(stream.bodies)
        await wait_for_metric(port, f"ltm_events_in_flight {float(HELD)}")
        await wait_for_metric(port, f"ltm_db_batch_size_sum {float(HELD)}")
        await gate.wait_for_waiters(int(await metric(port, "ltm_db_batch_size_count")))

        signalled = time.monotonic()
        first.signal(signal.SIGTERM)  # its "stopping" line is the first write into the closed pipe
        await gate.open()
        assert await first.wait_exit(timeout=grace_s + 20) == 0
        took = time.monotonic() - signalled
        assert took < grace_s, f"exit took {took:.1f}s with a grace period of {grace_s}s"

        second = await _second_worker_finishes(stack, shard, stream)

    # the first worker finished and acked what it had in flight; the second answered the rest, once each
    statuses = await check_outcome(stack.rows.conn, stream, shard.received, exactly_once=True)
    assert statuses[Status.SAVED] == EVENTS
    assert second.count(PROCESSED) == EVENTS - HELD


async def test_grace_period_over_requeues_in_flight_events_and_exits_zero(stack: Stack) -> None:
    grace_s = 1
    async with Shard(stack.rabbitmq_url) as shard:
        stream, gate, first = await _events_held_in_flight(stack, shard, grace_s)
        signalled = time.monotonic()
        first.signal(signal.SIGTERM)
        assert await first.wait_exit(timeout=grace_s + 10) == 0
        took = time.monotonic() - signalled
        assert took < grace_s + 4, f"exit took {took:.1f}s with a grace period of {grace_s}s"
        assert first.count("grace period over: in-flight events are requeued") == 1
        assert first.count("stopped cleanly") == 1
        assert first.count(PROCESSED) == 0
        assert len(shard.received.results) == 0
        assert await gate.waiters() == 0  # the abandoned transactions are gone, not stuck at the gate

        await gate.open()
        second = await _second_worker_finishes(stack, shard, stream)

    # the abandoned transactions rolled back: the second worker saved every event, once
    statuses = await check_outcome(stack.rows.conn, stream, shard.received, exactly_once=True)
    assert statuses[Status.SAVED] == EVENTS
    assert second.count(PROCESSED) == EVENTS


async def test_grace_period_over_with_postgres_not_answering_still_exits(stack: Stack) -> None:
    """The abandoned events' Postgres backends are frozen (SIGSTOP): their cancels go unanswered and
    their connections never come back to the pool. The worker must exit anyway, in bounded time."""
    grace_s = 1
    async with Shard(stack.rabbitmq_url) as shard:
        stream, gate, first = await _events_held_in_flight(stack, shard, grace_s)
        async with frozen_backends(stack.rows.conn, stack.postgres_dsn):
            signalled = time.monotonic()
            first.signal(signal.SIGTERM)
            code = await first.wait_exit(timeout=grace_s + 30)
            took = time.monotonic() - signalled
        assert code == 0
        # the grace period, 5 s for the cancelled events to let go, then their connections are cut
        assert took < grace_s + 5 + 4, f"exit took {took:.1f}s with a grace period of {grace_s}s"
        assert first.count("postgres does not answer; closing its connections") == 1
        assert first.count(PROCESSED) == 0

        await gate.open()
        await _second_worker_finishes(stack, shard, stream)

    # the frozen transactions never committed; once thawed they found their client gone and rolled back
    statuses = await check_outcome(stack.rows.conn, stream, shard.received, exactly_once=True)
    assert statuses[Status.SAVED] == EVENTS


@pytest.mark.slow
async def test_sigterm_during_a_broker_outage_with_postgres_not_answering_still_exits(
    private_broker: RabbitCluster, private_broker_stack: Stack
) -> None:
    """The broker (the session's private node) goes away while every in-flight event waits on a frozen
    Postgres: the worker abandons them and keeps trying to reconnect. Told to stop then, it must not wait
    for those connections."""
    stack = private_broker_stack
    async with Shard(stack.rabbitmq_url) as shard:
        stream, gate, first = await _events_held_in_flight(stack, shard, grace_s=1)
        async with (
            frozen_backends(stack.rows.conn, stack.postgres_dsn),
            rabbitmq_stopped(private_broker),
        ):
            await first.wait_for_log("rabbitmq unavailable", timeout=30)
            signalled = time.monotonic()
            first.signal(signal.SIGTERM)
            code = await first.wait_exit(timeout=30)
            took = time.monotonic() - signalled
        assert code == 0
        assert took < 3 + 3, f"exit took {took:.1f}s"  # the pool gets 3 s to hand its connections back
        assert first.count("postgres connections not released in time; closed without waiting") == 1
        assert first.count(PROCESSED) == 0

        await gate.open()
        await _second_worker_finishes(stack, shard, stream)

    statuses = await check_outcome(stack.rows.conn, stream, shard.received, exactly_once=True)
    assert statuses[Status.SAVED] == EVENTS


async def test_second_sigterm_exits_at_once_and_the_next_worker_answers(stack: Stack) -> None:
    grace_s = 30
    async with Shard(stack.rabbitmq_url) as shard:
        stream, gate, first = await _events_held_in_flight(stack, shard, grace_s)
        first.signal(signal.SIGTERM)
        await first.wait_for_log(STOPPING, timeout=5)
        signalled = time.monotonic()
        first.signal(signal.SIGTERM)
        code = await first.wait_exit(timeout=5)
        assert time.monotonic() - signalled < 2
        assert code != 0
        assert first.count(PROCESSED) == 0

        # the dead worker's writing statements were already at Postgres: they commit when the gate opens,
        # and the next worker answers those events from the ledger (replayed) instead of saving again
        await gate.open()
        second = await _second_worker_finishes(stack, shard, stream)

    statuses = await check_outcome(stack.rows.conn, stream, shard.received)
    assert statuses[Status.SAVED] == EVENTS
    assert second.count(PROCESSED) == EVENTS
    for event_id in stream.event_ids:  # one answer each: nothing was published by the dead worker
        assert len(shard.received.results[event_id]) == 1, shard.received.results[event_id]
