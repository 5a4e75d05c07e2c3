"""What this machine can do for the same work without the worker: the two ceilings.

(a) RabbitMQ alone: the same bodies, shards, window (or rate) and routing, published with confirms to a
    bench-only quorum queue declared like ``ltm.create_memory``; W echo processes (``bench.echo``)
    with the worker's prefetch consume it, publish a result of the worker's average result size (and a
    notice of the average notice size for the events the worker saved), confirmed, and ack.
(b) Postgres alone: the worker's own store path (:class:`~worker.service.batcher.Batcher`, which hands
    Postgres the events that are ready together, as the worker does) called directly on a second database
    seeded identically, with the same events (parsed beforehand), the worker fleet's total concurrency
    (``LTM_CONCURRENCY`` x W lanes) and total pool (``LTM_POSTGRES_POOL_SIZE`` x W connections, one batch
    at a time on each). One driver process: its CPU shows up as "bench" in the CPU table.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import aio_pika
import asyncpg

from bench.cpu import snapshot, usage
from bench.fleet import Processes
from bench.shards import PhaseResult, Progress
from bench.workload import PlannedEvent
from contracts.models import ToolCallEvent
from worker.broker.topology import work_queue_arguments
from worker.config import Limits, Topology
from worker.faults import is_transient
from worker.redact import describe
from worker.service.batcher import Batcher

ECHO_EXCHANGE = "bench.echo"
ECHO_QUEUE = "bench.echo.work"
TRANSIENT_TRIES = 5


async def declare_echo_topology(url: str, topology: Topology) -> None:
    """``bench.echo`` (topic) -> ``bench.echo.work`` (quorum, the work queue's arguments)."""
    connection = await aio_pika.connect(url, timeout=10)
    try:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(ECHO_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True)
        queue = await channel.declare_queue(
            ECHO_QUEUE, durable=True, arguments=work_queue_arguments(topology)
        )
        for key in topology.routing_keys:
            await queue.bind(exchange, key)
    finally:
        await connection.close()


def echo_processes(
    env: dict[str, str],
    log_dir: Path,
    topology: Topology,
    prefetch: int,
    result_bytes: int,
    notice_bytes: int,
) -> Processes:
    args = [
        "--queue", ECHO_QUEUE,
        "--results-exchange", topology.results_exchange,
        "--notifications-exchange", topology.notifications_exchange,
        "--prefetch", str(prefetch),
        "--result-bytes", str(result_bytes),
        "--notice-bytes", str(notice_bytes),
    ]  # fmt: skip
    return Processes("echo", "bench.echo", args, env, log_dir)


def parse_events(events: Sequence[PlannedEvent]) -> list[tuple[PlannedEvent, ToolCallEvent]]:
    """The events as the worker would parse them (done before the clock starts)."""
    return [(e, ToolCallEvent.model_validate_json(e.body)) for e in events]


async def play_postgres(
    pool: asyncpg.Pool,
    name: str,
    events: list[tuple[PlannedEvent, ToolCallEvent]],
    limits: Limits,
    lanes: int,
    progress: Progress,
    *,
    max_batch: int,
) -> PhaseResult:
    """Process ``events`` with ``lanes`` concurrent callers of the worker's store path (batches of at most
    ``max_batch``, one per pool connection at a time); latency per call."""
    result = PhaseResult(name, len(events))
    batcher = Batcher(pool, limits, max_running=pool.get_max_size(), max_batch=max_batch)
    in_flight = 0
    progress.begin(name, len(events), lambda: in_flight)
    queue: Iterator[tuple[PlannedEvent, ToolCallEvent]] = iter(events)

    async def lane() -> None:
        nonlocal in_flight
        for planned, parsed in queue:
            in_flight += 1
            started = time.perf_counter()
            for attempt in range(1, TRANSIENT_TRIES + 1):
                try:
                    processed = await batcher.process(parsed, attempt)
                    break
                except Exception as exc:  # the worker would retry a transient fault later
                    if not is_transient(exc) or attempt == TRANSIENT_TRIES:
                        result.errors.append(f"{planned.event_id}: {describe(exc)}")
                        in_flight -= 1
                        return
                    await asyncio.sleep(0.05 * attempt)
            result.latencies.append(time.perf_counter() - started)
            result.received[planned.event_id] = processed.status
            if processed.notification is not None:
                result.notices.add(planned.event_id)
            in_flight -= 1
            progress.done += 1

    before = snapshot()
    result.started = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(max(1, lanes))))
    result.finished = time.perf_counter()
    result.cpu = usage(before, snapshot())
    result.missing = [planned.event_id for planned, _ in events if planned.event_id not in result.received]
    progress.name = ""
    return result
