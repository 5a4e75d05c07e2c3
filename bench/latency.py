"""``python -m bench latency``: what a shard waits for one ``createMemory``, at realistic rates.

For each offered rate (open loop: calls go out on schedule whatever the answers do, and each latency runs
from the call's scheduled time, so a slow answer does not hide the next ones), side by side:

- ``kit``: the TypeScript kit (``contracts/typescript/dist``, built) in Node, ``bench/kit_latency.mjs``,
  against one spawned ``worker run``;
- ``python``: a Python shard (``sim.shard.ShardLink``, aio-pika) publishing the same events;
- ``echo``: the floor from RabbitMQ alone: the same events through ``bench.echo`` (publish, confirm,
  consume, publish a result of the worker's size, ack) instead of the worker;
- ``kit+nagle`` with ``--nagle``: the kit with Nagle's algorithm forced back on (as before issue 20);

and, once, the Postgres floor: a single-row INSERT committed (autocommit), timed one after another.
Everything runs in a database and vhost of its own, removed at the end. Figures from a shared machine
vary from run to run: compare columns of one run, not runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import orjson
from aio_pika.abc import AbstractIncomingMessage

from bench.ceilings import ECHO_EXCHANGE, ECHO_QUEUE, declare_echo_topology, echo_processes
from bench.fleet import Processes, SpawnedFleet, worker_environment
from bench.latency_report import span_durations, summary, table
from bench.report import percentile
from bench.sandbox import Sandbox
from sim.shard import ShardLink
from worker.broker.topology import declare_topology
from worker.config import load_settings, overridden_env
from worker.service.policy import RetryPolicy
from worker.store.migrate import apply_migrations
from worker.testing.seed import BotRows

REPO = Path(__file__).resolve().parent.parent
KIT_DIST = REPO / "contracts/typescript/dist/index.js"
KIT_SCRIPT = Path(__file__).resolve().parent / "kit_latency.mjs"
TOOL_ROUTING_KEY = "tool.create_long_term_memory"
RESULT_BYTES = 450
#: calls made one at a time before each series (both the kit and the Python shards)
WARMUP_CALLS = 5

GUILD, CHANNEL, TRIGGER, SPARROW, BOT = (
    "1150000000000000001",
    "1150000000000000100",
    "1150000000000000200",
    "1150000000000000201",
    "1150000000000000999",
)
SHARD_KIT, SHARD_PYTHON, SHARD_ECHO = 3, 1, 2


@dataclass
class Series:
    path: str
    rate: float
    latencies_ms: list[float]
    errors: int = 0
    #: CPU of the process answering (the worker, or the echo consumer) per call, ms
    cpu_ms_per_call: float | None = None
    #: CPU of the calling process (the Node kit, or this Python process for a Python shard) per call, ms
    shard_cpu_ms_per_call: float | None = None

    def to_json(self) -> dict[str, Any]:
        values = sorted(self.latencies_ms)
        figures = {f"p{p}": round(percentile(values, p), 2) for p in (50, 90, 99)}
        cpu = None if self.cpu_ms_per_call is None else round(self.cpu_ms_per_call, 3)
        return {
            "path": self.path,
            "rate": self.rate,
            "calls": len(values),
            "errors": self.errors,
            **figures,
            "max": round((values or [0.0])[-1], 2),
            "cpu_ms_per_call": cpu,
            "shard_cpu_ms_per_call": None
            if self.shard_cpu_ms_per_call is None
            else round(self.shard_cpu_ms_per_call, 3),
        }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench latency", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--rates", default="5,50,200", help="offered calls per second, comma-separated (5,50,200)")
    p.add_argument("--seconds", type=float, default=4.0, help="seconds offered per rate and path (4)")
    p.add_argument(
        "--min-calls", type=int, default=40, help="at least this many calls per rate and path (40)"
    )
    p.add_argument("--commits", type=int, default=200, help="Postgres single-row commits timed (200)")
    p.add_argument("--idle", type=float, default=3.0, help="seconds the idle worker's CPU is measured (3)")
    p.add_argument(
        "--stages",
        action="store_true",
        help="trace the worker (LTM_TRACING=console), print each span's duration: where an event's time "
        "goes (tracing costs CPU: the latencies of such a run are not comparable)",
    )
    p.add_argument("--nagle", action="store_true", help="also run the kit with Nagle's algorithm on")
    p.add_argument(
        "--paths", default="echo,python,kit", help="which paths, comma-separated (echo,python,kit)"
    )
    p.add_argument(
        "--postgres-dsn", help="a server where the bench may create a database (env LTM_POSTGRES_DSN)"
    )
    p.add_argument(
        "--rabbitmq-url", help="the broker (env LTM_RABBITMQ_URL); a vhost is made with rabbitmqctl"
    )
    p.add_argument("--redis-url", help="Redis for the worker (env LTM_REDIS_URL)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if args.nagle and "kit+nagle" not in paths:
        paths.append("kit+nagle")
    if any(p.startswith("kit") for p in paths):
        if shutil.which("node") is None:
            print("bench latency: node is not on PATH (the kit path runs in Node)", file=sys.stderr)
            return 2
        if not KIT_DIST.exists():
            print(f"bench latency: build the kit first: npm ci && npm run build in {KIT_DIST.parents[1]}",
                  file=sys.stderr)  # fmt: skip
            return 2
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    report = asyncio.run(run(args, rates, paths))
    if args.json:
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(table(report))
    return 0 if all(s["errors"] == 0 for s in report["series"]) else 1


async def run(args: argparse.Namespace, rates: list[float], paths: list[str]) -> dict[str, Any]:
    given = {
        option: getattr(args, option) or None for option in ("postgres_dsn", "rabbitmq_url", "redis_url")
    }
    settings = load_settings(overridden_env(os.environ, **given))
    topology = settings.topology
    sandbox = Sandbox(settings.postgres_dsn)
    log_dir = Path(tempfile.mkdtemp(prefix=f"ltm-latency-{sandbox.token}-"))
    fleet: SpawnedFleet | None = None
    echo: Processes | None = None
    try:
        dsn = await sandbox.new_database()
        url = await sandbox.new_vhost(settings.rabbitmq_url)
        await apply_migrations(dsn)
        persona_id = await seed(dsn)
        commit_ms = await time_commits(dsn, args.commits)
        connection = await aio_pika.connect(url, timeout=10)
        try:
            delays = RetryPolicy.of(settings).tiers()
            await declare_topology(await connection.channel(), topology, delays)
        finally:
            await connection.close()
        await declare_echo_topology(url, topology)
        # no server limit in the way of a long run; --stages traces the worker
        overrides: dict[str, object] = {"max_server_memories": 100000000}
        if args.stages:
            overrides["tracing"] = "console"
        worker_env = worker_environment(os.environ, settings, postgres_dsn=dsn, rabbitmq_url=url, **overrides)
        fleet = SpawnedFleet(1, worker_env, log_dir)
        await fleet.start(url, topology.work_queue)
        if "echo" in paths:
            echo = echo_processes(worker_env, log_dir, topology, settings.prefetch, RESULT_BYTES, 900)
            echo.start(1)
            await echo.wait_consuming(url, ECHO_QUEUE, 1)
        # the worker idle (consuming, nothing to do): its timers, samplers and probes, per second
        idle_before, idle_start = fleet.cpu_seconds() or 0.0, time.monotonic()
        await asyncio.sleep(args.idle)
        idle_ms_per_s = ((fleet.cpu_seconds() or 0.0) - idle_before) * 1000 / (time.monotonic() - idle_start)
        context = event_context(persona_id)
        series: list[Series] = []
        for rate in rates:
            count = max(args.min_calls, round(rate * args.seconds))
            for path in paths:
                answering = echo if path == "echo" else fleet
                assert answering is not None
                cpu_before = answering.cpu_seconds() or 0.0
                if path == "echo":
                    series.append(
                        await python_shard(url, SHARD_ECHO, rate, count, context, ECHO_EXCHANGE, "echo")
                    )
                elif path == "python":
                    series.append(
                        await python_shard(
                            url, SHARD_PYTHON, rate, count, context, topology.tool_calls_exchange, "python"
                        )
                    )
                elif path in ("kit", "kit+nagle"):
                    series.append(
                        await kit(url, rate, args.seconds, count, context, nagle=path == "kit+nagle")
                    )
                fleet.check_alive()
                # the whole series, idle gaps and warm-up calls included: what the answering process spends
                cpu = (answering.cpu_seconds() or 0.0) - cpu_before
                series[-1].cpu_ms_per_call = cpu * 1000 / (count + WARMUP_CALLS)
        load = os.getloadavg()
        stages = None
        if args.stages:
            # the worker exports its spans in batches (every 5 s): the last ones reach its log when it stops
            await fleet.stop()
            stages = span_durations(fleet.processes.log_path(0))
            fleet = None
        return {
            "stages_ms": stages,
            "series": [s.to_json() for s in series],
            "postgres_commit_ms": summary(commit_ms),
            "worker_idle_cpu_ms_per_s": round(idle_ms_per_s, 2),
            "load_average": [round(x, 2) for x in load],
            "cpus": os.cpu_count(),
            "run_id": sandbox.token,
        }
    finally:
        if echo is not None:
            await echo.stop()
        if fleet is not None:
            await fleet.stop()
        for problem in await sandbox.close():
            print(f"bench latency: {problem}", file=sys.stderr)
        shutil.rmtree(log_dir, ignore_errors=True)


async def seed(dsn: str) -> int:
    """The rows the original bot would have: a server, its persona, the triggering user and Sparrow."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = BotRows(conn)
        world = await rows.world(GUILD, TRIGGER)
        await rows.user(SPARROW)
        return world.persona_id
    finally:
        await conn.close()


async def time_commits(dsn: str, count: int) -> list[float]:
    """A single-row INSERT committed (autocommit), one after another: the Postgres floor of a save."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE TABLE bench_commit (id bigserial PRIMARY KEY, content text NOT NULL)")
        out = []
        for i in range(count):
            start = time.perf_counter()
            await conn.execute("INSERT INTO bench_commit (content) VALUES ($1)", f"commit {i}")
            out.append((time.perf_counter() - start) * 1000)
        return out[min(10, count // 10) :]  # the first few warm the connection
    finally:
        await conn.close()


def event_context(persona_id: int) -> dict[str, Any]:
    return {
        "guild_disc_id": GUILD,
        "channel_disc_id": CHANNEL,
        "triggering_user_disc_id": TRIGGER,
        "bot_user_disc_id": BOT,
        "persona_id": persona_id,
        "participants": [
            {"target_id": SPARROW, "display_label": "Sparrow", "aliases": ["Sparrow", "sparrow_ow"]}
        ],
        "guild_members": [{"user_disc_id": SPARROW, "username": "sparrow_ow", "global_name": "Sparrow"}],
    }


async def python_shard(
    url: str, shard_id: int, rate: float, count: int, context: dict[str, Any], exchange: str, path: str
) -> Series:
    """A Python shard: publish ``count`` events on schedule, time each first result."""
    link = ShardLink(url, shard_id)
    waiting: dict[str, asyncio.Future[float]] = {}

    async def on_result(message: AbstractIncomingMessage) -> None:
        event_id = orjson.loads(message.body)["event_id"]
        future = waiting.get(event_id)
        if future is not None and not future.done():
            future.set_result(time.perf_counter())

    async def on_notice(message: AbstractIncomingMessage) -> None:
        return None

    await link.open(on_result, on_notice, no_ack=True)
    series = Series(path, rate, [])
    try:
        loop = asyncio.get_running_loop()

        async def one(n: int, at: float) -> None:
            body = event(shard_id, n, context)
            future = waiting[body["event_id"]] = loop.create_future()
            try:
                await link.publish(orjson.dumps(body), exchange=exchange, routing_key=TOOL_ROUTING_KEY,
                                   message_id=body["event_id"], correlation_id=body["tool_call_id"],
                                   type="tool_call.v1")  # fmt: skip
                answered = await asyncio.wait_for(future, timeout=60)
                series.latencies_ms.append((answered - at) * 1000)
            except Exception as exc:
                series.errors += 1
                print(f"bench latency: {path}: {exc!r}", file=sys.stderr)

        for n in range(WARMUP_CALLS):  # warm up, one at a time
            await one(-1 - n, time.perf_counter())
        series.latencies_ms.clear()
        cpu_before = time.process_time()
        start = time.perf_counter() + 0.02
        tasks = []
        for n in range(count):
            at = start + n / rate
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            tasks.append(asyncio.create_task(one(n, at)))
        await asyncio.gather(*tasks)
        series.shard_cpu_ms_per_call = (time.process_time() - cpu_before) * 1000 / count
    finally:
        await link.close(delete_queues=False)  # the vhost goes at the end
    return series


def event(shard_id: int, n: int, context: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "event_id": str(uuid.uuid4()),
        "tool_call_id": f"call_py_{os.getpid()}_{n}_{uuid.uuid4().hex[:6]}",
        "tool_name": "create_long_term_memory",
        "issued_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "shard_id": shard_id,
        "arguments": {"memory_content": f"{{user}} likes python item {n}", "memory_scope": "server_wide"},
        "context": context,
    }


async def kit(
    url: str, rate: float, seconds: float, count: int, context: dict[str, Any], *, nagle: bool
) -> Series:
    """The TypeScript kit in Node (bench/kit_latency.mjs)."""
    env = {**os.environ, "LTM_RABBITMQ_URL": url, "LTM_BENCH_CONTEXT": json.dumps(context)}
    env["LTM_BENCH_NAGLE"] = "1" if nagle else "0"
    process = await asyncio.create_subprocess_exec(
        "node", str(KIT_SCRIPT), str(rate), str(count / rate), str(SHARD_KIT), str(count),
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), timeout=seconds + count / rate + 120)
    path = "kit+nagle" if nagle else "kit"
    if process.returncode != 0:
        print(
            f"bench latency: {path}: node exited {process.returncode}: {err.decode()[-2000:]}",
            file=sys.stderr,
        )
        return Series(path, rate, [], errors=count)
    result = json.loads(out.decode().strip().splitlines()[-1])
    series = Series(path, rate, [float(x) for x in result["latencies_ms"]], errors=int(result["errors"]))
    series.shard_cpu_ms_per_call = float(result["shard_cpu_ms_per_call"])
    return series
