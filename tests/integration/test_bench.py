"""``python -m bench`` end to end on a tiny workload: correctness only, never a timing (DESIGN.md)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

import aio_pika
import asyncpg
import pytest

from bench.batches import measure
from bench.latency import KIT_DIST
from bench.options import BenchOptions
from bench.run import bench_settings, run_bench
from bench.sandbox import MANAGEMENT_ENV_VAR
from bench.shards import ClosedLoop, Progress, Shards
from bench.workload import build_workload, by_shard
from bench.world import build_world
from tests.services import RABBITMQ, Services
from worker.config import Limits, Topology, env_of

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]


def tiny(**overrides: object) -> BenchOptions:
    defaults: dict[str, object] = {
        "events": 200,
        "warmup": 20,
        "shards": 3,
        "window": 16,
        "workers": 1,
        "servers": 20,
        "users": 300,
        "members": 12,
        "seed": 7,
        "timeout": 30.0,
        "progress": False,
    }
    return BenchOptions(**{**defaults, **overrides})  # type: ignore[arg-type]


def test_the_workload_is_deterministic_and_its_expectations_add_up() -> None:
    options = tiny()
    limits = bench_settings(options, env={}).limits

    def build() -> tuple[list[bytes], dict[str, int]]:
        world = build_world(
            seed=7, servers=20, personas_per_server=2, users=300, members_per_server=12, limits=limits
        )
        workload = build_workload(world, count=220, shards=3, seed=7, limits=limits)
        return [e.body for e in workload.events], dict(workload.expected)

    first, second = build(), build()
    assert first == second
    bodies, expected = first
    assert len(bodies) == 220
    assert sum(expected.values()) == 220


@pytest.mark.slow
async def test_bench_answers_every_event_with_its_expected_status(
    postgres_dsn: str, rabbitmq_url: str, redis_url: str
) -> None:
    options = tiny(postgres_dsn=postgres_dsn, rabbitmq_url=rabbitmq_url, redis_url=redis_url)

    report = await run_bench(options)

    check = report.check
    assert check.missing == 0, "every event is answered"
    assert check.received == check.expected, "the counts by status are the mix's"
    assert check.mismatches == [], "every event with a fixed expectation got it"
    assert check.notices == check.expected_notices, "one notice per save"
    assert check.errors == []
    assert len(check.expected) >= 6, "the mix exercises most statuses"
    assert report.rabbitmq is not None
    assert report.rabbitmq.missing == 0
    assert report.rabbitmq.errors == []
    assert report.rabbitmq.measured.answered == options.events
    assert report.postgres is not None
    assert report.postgres_check is not None
    assert report.postgres_check.ok, "process_event alone gives the same statuses"
    assert report.ok

    conn = await asyncpg.connect(postgres_dsn)
    try:
        left = await conn.fetchval(
            "SELECT count(*) FROM pg_database WHERE datname LIKE $1", f"ltm_bench_{report.config['run_id']}%"
        )
    finally:
        await conn.close()
    assert left == 0, "the bench drops the databases it created"


@pytest.mark.slow
async def test_batch_micro_bench_measures_each_size_and_cleans_up(postgres_dsn: str) -> None:
    async def bench_databases() -> set[str]:
        conn = await asyncpg.connect(postgres_dsn)
        try:
            rows = await conn.fetch("SELECT datname FROM pg_database WHERE datname LIKE 'ltm_bench_%'")
        finally:
            await conn.close()
        return {row["datname"] for row in rows}

    before = await bench_databases()
    costs = await measure(postgres_dsn, [1, 4], 40)

    assert [(c.size, c.events) for c in costs] == [(1, 40), (4, 40)]
    for cost in costs:
        assert cost.seconds > 0
        assert cost.client_cpu > 0
        assert cost.postgres_cpu is None or cost.postgres_cpu >= 0
        assert f"{cost.size:>5}  {cost.events:>7,}" in cost.row()
    assert await bench_databases() <= before, "the micro-bench drops its database"


async def test_a_closed_loop_ends_with_an_error_when_nobody_answers(rabbitmq_url: str) -> None:
    """Every window full and no answer: the phase gives up after the idle timeout instead of waiting."""
    topology = Topology()
    connection = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await connection.channel()
        exchanges = (topology.tool_calls_exchange, topology.results_exchange, topology.notifications_exchange)
        for name in exchanges:
            await channel.declare_exchange(name, aio_pika.ExchangeType.TOPIC, durable=True)
        unconsumed = await channel.declare_queue("bench.nobody.consumes", durable=True)
        await unconsumed.bind(topology.tool_calls_exchange, "#")
        limits = Limits()
        world = build_world(
            seed=7, servers=20, personas_per_server=2, users=300, members_per_server=12, limits=limits
        )
        workload = build_workload(world, count=12, shards=2, seed=7, limits=limits)
        shards = Shards(rabbitmq_url, 2)
        await shards.open(topology)
        try:
            # a safety net only: without the stall check this play waited for a free slot for ever
            async with asyncio.timeout(120):
                result = await shards.play(
                    "stalled",
                    by_shard(workload.events, 2),
                    ClosedLoop(window=2),
                    exchange=topology.tool_calls_exchange,
                    progress=Progress(enabled=False),
                    idle_timeout=0.5,
                )
        finally:
            await shards.close()
        published = (await channel.declare_queue(unconsumed.name, passive=True)).declaration_result
    finally:
        await connection.close()

    assert result.answered == 0
    assert len(result.missing) == 4, "two shards, two unanswered events each: their windows"
    assert published.message_count == 4, "nothing more was published once the windows were full"
    assert any("stopped answering" in error for error in result.errors), result.errors


@pytest.mark.slow
async def test_bench_json_prints_one_json_object(
    postgres_dsn: str, rabbitmq_url: str, redis_url: str
) -> None:
    """``python -m bench --json`` as a user runs it: exit 0, one JSON object (it crashed on a key)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench",
        "--json",
        "--no-progress",
        "--events=40",
        "--warmup=8",
        "--shards=2",
        "--servers=20",
        "--users=300",
        "--members=12",
        f"--postgres-dsn={postgres_dsn}",
        f"--rabbitmq-url={rabbitmq_url}",
        f"--redis-url={redis_url}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO_ROOT,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=300)
    assert process.returncode == 0, err.decode(errors="replace")[-3000:]
    report = json.loads(out)
    assert report["ok"] is True
    assert report["status_check"]["missing"] == 0
    assert set(report["runs"]) >= {"worker", "rabbitmq", "postgres"}
    assert report["runs"]["worker"]["answered"] == 40


@pytest.mark.slow
async def test_bench_latency_prints_a_row_per_rate_and_path(
    postgres_dsn: str, rabbitmq_url: str, redis_url: str, test_services: Services
) -> None:
    """``python -m bench latency`` end to end on a few calls: every path answers, every call is counted, and
    the database and vhost are gone after (correctness only; the figures are the command's to print)."""
    # the bench makes its own vhost: with rabbitmqctl on this machine, or through a broker's management API
    management = test_services.resolve(RABBITMQ).management_url
    extra = {MANAGEMENT_ENV_VAR: management} if management else {}
    paths = "echo,python,kit" if shutil.which("node") and KIT_DIST.exists() else "echo,python"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench", "latency", "--json", "--rates=10,40", "--seconds=0.5",
        "--min-calls=8", "--commits=30", "--idle=0.5", "--stages", f"--paths={paths}",
        f"--postgres-dsn={postgres_dsn}",
        f"--redis-url={redis_url}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO_ROOT,
        env={**os.environ, **env_of(rabbitmq_url=rabbitmq_url), **extra},
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), timeout=300)
    assert process.returncode == 0, err.decode(errors="replace")[-3000:]
    report = json.loads(out)
    wanted = paths.split(",")
    assert [(s["rate"], s["path"]) for s in report["series"]] == [(r, p) for r in (10, 40) for p in wanted]
    for series in report["series"]:
        assert series["errors"] == 0, series
        assert series["calls"] == (8 if series["rate"] == 10 else 20), series
        assert 0 < series["p50"] <= series["p90"] <= series["p99"] <= series["max"], series
        # the consumer's CPU is read in clock ticks (10 ms): 8 echo calls can take less than one
        assert series["cpu_ms_per_call"] >= 0, series
    assert sum(s["cpu_ms_per_call"] * s["calls"] for s in report["series"]) > 0, report["series"]
    assert report["postgres_commit_ms"]["n"] > 0
    # --stages: the worker's spans, one per event and step (5 warm-up calls per series too)
    stages = report["stages_ms"]
    events = sum(s["calls"] for s in report["series"] if s["path"] != "echo")
    assert stages["ltm.create_memory process"]["n"] >= events, stages
    assert stages["postgres ltm_save_events"]["n"] >= events, stages

    conn = await asyncpg.connect(postgres_dsn)
    try:
        left = await conn.fetchval(
            "SELECT count(*) FROM pg_database WHERE datname LIKE $1", f"ltm_bench_{report['run_id']}%"
        )
    finally:
        await conn.close()
    assert left == 0, "the latency bench drops its database"


async def test_bench_noisy_answers_every_event_of_both_shards_once_and_reports_the_loud_one(
    postgres_dsn: str, rabbitmq_url: str, test_services: Services
) -> None:
    """``python -m bench noisy`` on a small flood: both rounds print B's latency and the worker's own share of
    it, `worker shards` names shard A loudest, every event of both shards is answered exactly once and the
    queues end empty (correctness only; the figures are the command's to print)."""
    text = await bench_output(
        test_services, "noisy", "--flood=200", "--rate=20", "--quiet-seconds=1", "--shards-report",
        f"--postgres-dsn={postgres_dsn}", f"--rabbitmq-url={rabbitmq_url}",
    )  # fmt: skip
    lines = text.splitlines()
    quiet = next(line for line in lines if line.startswith("B quiet"))
    assert "20/20 answered" in quiet, quiet
    assert sum(line.startswith("  of which in process: ms p50 ") for line in lines) == 2, text
    flood = next(line for line in lines if line.startswith("A's flood: "))
    assert flood.startswith("A's flood: 200/200 answered"), flood
    assert "0 unanswered, 0 answered twice" in text, text
    assert "queues left non-empty: none" in text, text
    report = lines[lines.index(next(line for line in lines if line.startswith("$ worker shards"))) :]
    rows = [line.split() for line in report[1:] if line.split() and line.split()[0].isdigit()]
    assert rows, report
    assert rows[0][0] == "0", f"shard A (0) is the loudest: {report}"


async def test_bench_replay_answers_every_letter_once_through_a_cancel_and_times_each_step(
    postgres_dsn: str, rabbitmq_url: str, test_services: Services
) -> None:
    """``python -m bench replay`` on 800 letters at 100/s: the paced replay moves them all beside the quiet
    shard's saves, the cancelled one stops with exit 130 and the next finishes it with every letter answered
    once and the queues empty, history shows both, and the steps are timed (correctness only: the figures are
    the command's to print)."""
    text = await bench_output(
        test_services, "replay", "--letters=800", "--rate=100", "--quiet-seconds=1", "--cancel-after=1",
        f"--postgres-dsn={postgres_dsn}", f"--rabbitmq-url={rabbitmq_url}",
    )  # fmt: skip
    lines = [line.strip() for line in text.splitlines()]
    assert "$ worker dlq replay --rate 100 --by bench-paced  -> exit 0" in text, text
    assert any(line.startswith("quiet shard 2, during the replay: n ") for line in lines), text
    cancelled = next(line for line in lines if "--by bench-cancelled" in line)
    assert "-> exit 130" in cancelled, cancelled
    assert "cancelled by bench-canceller" in cancelled, cancelled
    once = "0 missing, 0 answered twice; Postgres: 800 ledger rows (0 missing), 0 memories saved twice"
    assert once in text, text
    assert "queues left non-empty: none" in text, text
    history = next(line for line in lines if line.startswith("history: the cancelled replay"))
    assert history.endswith(": 800 replayed between them"), history
    assert any(line.startswith("publish, wait for the confirms") for line in lines), text
    assert "replayed in this process (exit 0: moved 800, kept 0)" in text, text


async def bench_output(test_services: Services, *args: str) -> str:
    """``python -m bench ARGS``, which starts a private Redis and makes its own vhost (with rabbitmqctl, or
    through the broker's management API): what it printed, once it exited 0."""
    if shutil.which("redis-server") is None:
        pytest.fail(
            f"redis-server is not installed: bench {args[0]} starts a private Redis (apt-get install redis)"
        )
    management = test_services.resolve(RABBITMQ).management_url
    extra = {MANAGEMENT_ENV_VAR: management} if management else {}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO_ROOT,
        env={**os.environ, **extra},
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), timeout=300)
    text = out.decode(errors="replace")
    assert process.returncode == 0, text[-3000:] + err.decode(errors="replace")[-3000:]
    return text
