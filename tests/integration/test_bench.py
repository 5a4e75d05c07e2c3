"""``worker bench`` end to end on a tiny workload: correctness only, never a timing (DESIGN.md)."""

from __future__ import annotations

import asyncpg
import pytest

from bench.batches import measure
from bench.options import BenchOptions
from bench.run import bench_settings, run_bench
from bench.workload import build_workload
from bench.world import build_world

pytestmark = pytest.mark.integration


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
