"""``python -m bench`` from top to bottom:

1. build the world and the workload (deterministic for --seed), so every event's status is known;
2. create the bench database and vhost, seed the database, declare the topology, open S shards;
3. start W workers (or find the external fleet), play the warmup, then the measured window;
4. ceilings: (a) echo consumers on a bench-only queue, same shards and events; (b) the worker's store
   path (batches included) driven directly against a second database seeded identically;
5. check the counts by status, print the table (or JSON), remove the databases and vhost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import aio_pika

from bench import ceilings
from bench.echo import NOTICE_HEADER
from bench.fleet import ExternalFleet, Fleet, SpawnedFleet, worker_environment
from bench.options import SETTING_OPTIONS, BenchOptions
from bench.report import BenchReport, Run, StatusCheck
from bench.sandbox import (
    Sandbox,
    SandboxError,
    check_database_is_empty,
    check_vhost_is_free,
)
from bench.seed import Prefill, analyze, seed_database
from bench.shards import ClosedLoop, LoadMode, OpenLoop, PhaseResult, Progress, Shards
from bench.workload import SAVED, PlannedEvent, Workload, WorldTooSmall, build_workload, by_shard
from bench.world import World, build_world
from sim.process import ProcessFailed
from worker.broker.topology import declare_topology
from worker.broker.urls import first_answering
from worker.config import Settings, load_settings, overridden_env
from worker.redact import redact_url as redact
from worker.service.policy import RetryPolicy
from worker.store.pool import create_pool

DEFAULT_RESULT_BYTES = 450
DEFAULT_NOTICE_BYTES = 900

T = TypeVar("T")


def main(args: argparse.Namespace) -> int:
    """Entry point of ``python -m bench``."""
    options = BenchOptions.from_args(args)
    problems = options.problems()
    if problems:
        for problem in problems:
            print(f"python -m bench: {problem}", file=sys.stderr)
        return 2
    try:
        report = asyncio.run(run_bench(options))
    except (SandboxError, ProcessFailed, WorldTooSmall) as exc:  # FleetError is a ProcessFailed
        print(f"python -m bench: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the workers are stopped and the sandbox removed on the way out
        print("python -m bench: interrupted", file=sys.stderr)
        return 130
    if options.json:
        import orjson

        sys.stdout.write(orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(report.table())
    return 0 if report.ok else 1


def bench_settings(options: BenchOptions, env: Mapping[str, str] | None = None) -> Settings:
    """The worker settings of this run: the environment, with the bench's options on top (as `worker run`'s
    options: read by the variable's rule, over its file form too)."""
    overrides = {field: getattr(options, option) for option, field in SETTING_OPTIONS.items()}
    return load_settings(overridden_env(os.environ if env is None else env, **overrides))


async def run_bench(options: BenchOptions) -> BenchReport:
    """Run the whole bench; raises :class:`SandboxError`/:class:`ProcessFailed` when it cannot run."""
    settings = bench_settings(options)
    limits, topology = settings.limits, settings.topology
    world = build_world(
        seed=options.seed,
        servers=options.servers,
        personas_per_server=options.personas,
        users=options.users,
        members_per_server=options.members,
        limits=limits,
    )
    workload = build_workload(
        world, count=options.warmup + options.events, shards=options.shards, seed=options.seed, limits=limits
    )
    prefill = Prefill(workload.server_memories, workload.personal_memories)
    warm_events, measured_events = workload.split(options.warmup)
    warm_plan, plan = by_shard(warm_events, options.shards), by_shard(measured_events, options.shards)
    mode: LoadMode = OpenLoop(options.rate) if options.rate else ClosedLoop(options.window)

    progress = Progress(options.progress)
    printer = asyncio.create_task(progress.run())
    sandbox = Sandbox(settings.postgres_dsn, keep=options.keep)
    log_dir = Path(tempfile.mkdtemp(prefix=f"ltm-bench-{sandbox.token}-"))
    fleet: Fleet | None = None
    shards: Shards | None = None
    notes: list[str] = []
    report: BenchReport | None = None
    try:
        if options.fleet == "external":
            assert options.postgres_dsn is not None
            dsn = options.postgres_dsn
            await check_database_is_empty(dsn)
        else:
            dsn = await sandbox.new_database()
        progress.say(f"seeding {dsn.rpartition('/')[2]}: {world.counts()}")
        seeded = await seed_database(dsn, world, prefill)
        # a list of cluster nodes: the bench measures, it does not fail over, so it (shards, declares,
        # its own workers) uses the first node that answers
        if options.rabbitmq_url:
            url = await first_answering(options.rabbitmq_url)
            external = options.fleet == "external"
            await check_vhost_is_free(url, topology.work_queue, consumers_allowed=external)
        else:
            url = await sandbox.new_vhost(await first_answering(settings.rabbitmq_url))
        await _declare(url, settings)

        shards = Shards(url, options.shards)
        await shards.open(topology)
        # the bench's settings (limits, prefetch, concurrency, pool) with its own database and vhost
        worker_env = worker_environment(os.environ, settings, postgres_dsn=dsn, rabbitmq_url=url)
        if options.fleet == "external":
            fleet = ExternalFleet(options.workers)
        else:
            fleet = SpawnedFleet(options.workers, worker_env, log_dir)
        progress.say(f"starting {fleet.describe()}; logs in {log_dir}")
        await fleet.start(url, topology.work_queue)

        async def play_worker(name: str, plan: list[list[PlannedEvent]]) -> PhaseResult:
            assert shards is not None
            assert fleet is not None
            result = await shards.play(
                name,
                plan,
                mode,
                exchange=topology.tool_calls_exchange,
                progress=progress,
                idle_timeout=options.timeout,
                cpu_pids=fleet.pids,
            )
            fleet.check_alive()
            return result

        worker_run = Run(
            "worker",
            f"worker, {options.workers} process{'es' if options.workers != 1 else ''}",
            await play_worker("worker warmup", warm_plan),
            await _analyzed(dsn, play_worker("worker", plan)),
        )
        await fleet.stop()
        check = _check(workload, worker_run)

        rabbit_run = pg_run = None
        pg_check = None
        if not options.skip_ceilings:
            rabbit_run = await _rabbitmq_ceiling(
                options,
                settings,
                url,
                shards,
                mode,
                warm_plan,
                plan,
                worker_run,
                worker_env,
                log_dir,
                progress,
            )
            pg_run, pg_check = await _postgres_ceiling(
                options, settings, sandbox, world, prefill, workload, progress
            )
        if options.rate and worker_run.measured.throughput < 0.95 * options.rate:
            notes.append(
                f"offered {options.rate:g} events/s, the worker answered "
                f"{worker_run.measured.throughput:,.0f}/s: it is saturated, latency includes the backlog"
            )
        if options.fleet == "external":
            notes.append(f"external fleet: the database {redact(dsn)} was seeded and is left in place")
        report = BenchReport(
            config={
                "events": options.events,
                "warmup": options.warmup,
                "shards": options.shards,
                "mode": mode.describe(),
                "window": options.window if isinstance(mode, ClosedLoop) else None,
                "rate": options.rate,
                "fleet": fleet.describe(),
                "workers": options.workers,
                "members": options.members,
                "seed": options.seed,
                "prefetch": settings.prefetch,
                "concurrency": settings.concurrency,
                "pool_size": settings.postgres_pool_size,
                "cpus": os.cpu_count(),
                "run_id": sandbox.token,
            },
            world=world.counts(),
            seeded=seeded,
            limits=limits,
            categories=workload.categories,
            worker=worker_run,
            check=check,
            rabbitmq=rabbit_run,
            postgres=pg_run,
            postgres_check=pg_check,
            notes=notes,
        )
    finally:
        if fleet is not None:
            await fleet.stop()
        if shards is not None:
            await shards.close()
        printer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await printer
        for line in await sandbox.close():
            progress.say(line)
        if report is not None and report.ok and not options.keep:
            shutil.rmtree(log_dir, ignore_errors=True)
        else:
            progress.say(f"process logs kept in {log_dir}")
    return report


async def _declare(url: str, settings: Settings) -> None:
    """The worker's topology, declared up front so the shards can publish before a worker is up."""
    connection = await aio_pika.connect(url, timeout=10)
    try:
        channel = await connection.channel()
        delays = RetryPolicy.of(settings).tiers()
        await declare_topology(channel, settings.topology, delays)
    finally:
        await connection.close()


def _check(workload: Workload, run: Run) -> StatusCheck:
    received = run.received
    mismatches = [
        (event, received.get(event.event_id))
        for event in workload.events
        if event.expected is not None
        and event.event_id in received
        and received[event.event_id] != event.expected
    ]
    notices = len(run.warmup.notices) + len(run.measured.notices)
    return StatusCheck(
        expected=workload.expected,
        received=Counter(received.values()),
        mismatches=mismatches,
        missing=sum(1 for e in workload.events if e.event_id not in received),
        notices=notices,
        errors=run.errors,
    )


async def _rabbitmq_ceiling(
    options: BenchOptions,
    settings: Settings,
    url: str,
    shards: Shards,
    mode: LoadMode,
    warm_plan: list[list[PlannedEvent]],
    plan: list[list[PlannedEvent]],
    worker_run: Run,
    env: dict[str, str],
    log_dir: Path,
    progress: Progress,
) -> Run:
    measured = worker_run.measured
    result_bytes = measured.result_bytes // measured.answered if measured.answered else DEFAULT_RESULT_BYTES
    notices = len(measured.notices)
    notice_bytes = measured.notice_bytes // notices if notices else DEFAULT_NOTICE_BYTES
    await ceilings.declare_echo_topology(url, settings.topology)
    echo = ceilings.echo_processes(
        env, log_dir, settings.topology, settings.prefetch, result_bytes, notice_bytes
    )
    progress.say(
        f"ceiling (a): {options.workers} echo consumer(s), results {result_bytes} B, notices {notice_bytes} B"
    )
    try:
        echo.start(options.workers)
        await echo.wait_consuming(url, ceilings.ECHO_QUEUE, options.workers)

        def notice_header(event: PlannedEvent) -> dict[str, Any]:
            return {NOTICE_HEADER: 1} if event.expected == SAVED else {}

        async def play(name: str, phase_plan: list[list[PlannedEvent]]) -> PhaseResult:
            result = await shards.play(
                name,
                phase_plan,
                mode,
                exchange=ceilings.ECHO_EXCHANGE,
                progress=progress,
                idle_timeout=options.timeout,
                headers=notice_header,
                cpu_pids=echo.pids,
            )
            echo.check_alive()
            return result

        warm = await play("(a) RabbitMQ warmup", warm_plan)
        return Run("rabbitmq", "(a) RabbitMQ alone", warm, await play("(a) RabbitMQ alone", plan))
    finally:
        await echo.stop()


async def _analyzed(dsn: str, phase: Awaitable[T]) -> T:
    """``phase`` after an ``ANALYZE`` of the warmed-up database (see :func:`analyze`)."""
    await analyze(dsn)
    return await phase


async def _postgres_ceiling(
    options: BenchOptions,
    settings: Settings,
    sandbox: Sandbox,
    world: World,
    prefill: Prefill,
    workload: Workload,
    progress: Progress,
) -> tuple[Run, StatusCheck]:
    dsn = await sandbox.new_database("_pg")
    progress.say(f"ceiling (b): seeding {dsn.rpartition('/')[2]} identically")
    await seed_database(dsn, world, prefill)
    parsed = ceilings.parse_events(workload.events)
    warm, measured = parsed[: options.warmup], parsed[options.warmup :]
    lanes = settings.concurrency * options.workers
    pool = await create_pool(
        dsn,
        size=settings.postgres_pool_size * options.workers,
        statement_cache_size=settings.postgres_statement_cache_size,
    )
    try:
        warm_result = await ceilings.play_postgres(
            pool,
            "(b) Postgres warmup",
            warm,
            settings.limits,
            lanes,
            progress,
            max_batch=settings.concurrency,
        )
        measured_result = await _analyzed(
            dsn,
            ceilings.play_postgres(
                pool,
                "(b) Postgres alone",
                measured,
                settings.limits,
                lanes,
                progress,
                max_batch=settings.concurrency,
            ),
        )
    finally:
        await pool.close()
    run = Run("postgres", "(b) Postgres alone", warm_result, measured_result)
    return run, _check(workload, run)
