"""The worker through PgBouncer in transaction pooling mode (a pooler of the test's own, see
tests/e2e/pgbouncer.py), with more worker processes than PgBouncer has server connections; and a libpq
multi-host DSN whose first host is down. The round trip, scale-out races, crash and shutdown tests run
through PgBouncer too (their ``[pgbouncer]`` variants, see the ``pgbouncer`` marker)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import asyncpg
import pytest

from contracts.models import Status
from tests.e2e.pgbouncer import SERVER_CONNECTIONS, PgBouncer, find_pgbouncer
from tests.e2e.stack import Stack
from tests.e2e.workload import (
    build_stream,
    check_outcome,
    limit_env,
    processed_counts,
    seed_scopes,
    wait_for_results,
)
from tests.factories import BotRows, event_body
from tests.support.harness import Shard
from worker.store.migrate import available_migrations
from worker.testing.workers import free_port

pytestmark = pytest.mark.e2e

WORKERS = 5
POOL_SIZE = 4
EVENTS = 1500


@pytest.fixture
def pgbouncer(postgres_dsn: str) -> Iterator[PgBouncer]:
    executable = find_pgbouncer()
    if executable is None:
        pytest.skip("pgbouncer is not installed: `apt-get install pgbouncer` (.ci/run installs it)")
    bouncer = PgBouncer(executable, postgres_dsn).start()
    try:
        yield bouncer
    finally:
        bouncer.close()


@pytest.fixture
async def pooled_stack(
    pgbouncer: PgBouncer, postgres_dsn: str, rabbitmq_url: str, redis_url: str, tmp_path: Path
) -> AsyncIterator[Stack]:
    """A stack whose workers reach Postgres only through ``pgbouncer``; the schema is not migrated yet."""
    conn = await asyncpg.connect(postgres_dsn)
    stack = Stack(pgbouncer.through(postgres_dsn), rabbitmq_url, redis_url, tmp_path, BotRows(conn))
    try:
        yield stack
    finally:
        for process in stack.workers:
            process.kill()
        await conn.close()


async def test_concurrent_migrations_and_check_work_through_pgbouncer(pooled_stack: Stack) -> None:
    stack = pooled_stack
    runs = await asyncio.gather(*(asyncio.to_thread(stack.cli, "migrate") for _ in range(3)))
    for done in runs:
        assert done.returncode == 0, done.stdout + done.stderr
    # the migrations take turns on a transaction-scoped lock: one run applies everything, the others
    # find nothing to do (a session lock through a transaction pooler would be left held by a server
    # connection, and hang every later migrate)
    outputs = [done.stdout + done.stderr for done in runs]
    assert sum("migrations applied" in out for out in outputs) == 1, outputs
    assert sum("schema is up to date" in out for out in outputs) == 2, outputs
    applied = await stack.rows.conn.fetchval("SELECT count(*) FROM ltm_schema_migrations")
    assert applied == len(available_migrations())
    again = await asyncio.to_thread(stack.cli, "migrate")
    assert again.returncode == 0
    assert "schema is up to date" in again.stdout + again.stderr

    checked = await asyncio.to_thread(stack.cli, "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert re.search(r"^ok\s+postgres\s+.*\n\s+server .*; schema up to date", checked.stdout, re.M)


async def test_more_workers_than_server_connections_answer_every_event_once(
    pooled_stack: Stack, pgbouncer: PgBouncer, record_property: Callable[[str, object], None]
) -> None:
    stack = pooled_stack
    assert (await asyncio.to_thread(stack.cli, "migrate")).returncode == 0
    server_scopes, personal_scopes = await seed_scopes(stack.rows)
    stream = build_stream(EVENTS, server_scopes, personal_scopes, seed=31)
    processes = [stack.worker(**limit_env(), LTM_POSTGRES_POOL_SIZE=str(POOL_SIZE)) for _ in range(WORKERS)]
    await stack.workers_ready()

    database = await stack.rows.conn.fetchval("SELECT current_database()")
    peaks = {"server": 0, "clients": 0}

    async def sample() -> None:
        # Postgres's own view of the connections to this database (PgBouncer's server connections; the
        # test's own connection excluded), and PgBouncer's count of its clients
        while True:
            servers = await stack.rows.conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
                database,
            )
            pools = await asyncio.to_thread(pgbouncer.show, "POOLS")
            clients = sum(
                int(p["cl_active"]) + int(p["cl_waiting"]) for p in pools if p["database"] == database
            )
            peaks["server"] = max(peaks["server"], servers)
            peaks["clients"] = max(peaks["clients"], clients)
            await asyncio.sleep(0.2)

    sampler = asyncio.create_task(sample())
    started = time.monotonic()
    try:
        async with Shard(stack.rabbitmq_url) as shard:
            await shard.publish_many(stream.bodies)
            await wait_for_results(shard, stream.event_ids, timeout=180, workers=processes)
            took = time.monotonic() - started
            for process in processes:
                process.signal(signal.SIGTERM)
            for process in processes:
                assert await process.wait_exit(timeout=30) == 0
            await shard.settle()
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler

    statuses = await check_outcome(stack.rows.conn, stream, shard.received, exactly_once=True)
    assert statuses[Status.SAVED] > 0, statuses
    assert statuses[Status.LIMIT_EXCEEDED] > 0, (
        statuses
    )  # the workers raced for the last slots of full scopes
    counts = processed_counts(processes)
    assert sum(counts.values()) == EVENTS, counts
    assert 0 < peaks["server"] <= SERVER_CONNECTIONS, peaks
    assert peaks["clients"] > SERVER_CONNECTIONS, peaks  # more clients than server connections, really
    figures = {
        "worker_processes": WORKERS,
        "pool_size_per_worker": POOL_SIZE,
        "pgbouncer_server_connections": SERVER_CONNECTIONS,
        "peak_server_connections": peaks["server"],
        "peak_pgbouncer_clients": peaks["clients"],
        "events": EVENTS,
        "events_per_s": round(EVENTS / took, 1),
        **{status: count for status, count in sorted(statuses.items())},
    }
    for name, value in figures.items():
        record_property(name, value)
    print(f"\npgbouncer figures: {figures}")


async def test_a_multi_host_dsn_with_its_first_host_down_works(stack: Stack) -> None:
    """libpq's multi-host form (asyncpg reads it too): the first host refuses, the second is the server."""
    dead = free_port()
    multi = re.sub(
        r"@([^/]+)/",
        lambda m: f"@127.0.0.1:{dead},{m.group(1)}/",
        stack.postgres_dsn,
        count=1,
    )
    multi += ("&" if "?" in multi else "?") + "target_session_attrs=read-write"
    assert f"127.0.0.1:{dead}," in multi

    for command in ("migrate", "check"):
        done = await asyncio.to_thread(stack.cli, command, LTM_POSTGRES_DSN=multi)
        assert done.returncode == 0, done.stdout + done.stderr

    world = await stack.rows.world()
    worker = stack.worker(LTM_POSTGRES_DSN=multi)
    await worker.wait_for_log("consuming")
    arguments = {"memory_content": "likes standbys", "memory_scope": "server_wide"}
    event = event_body(arguments, persona_id=world.persona_id)
    async with Shard(stack.rabbitmq_url) as shard:
        await shard.publish(event)
        await shard.wait_for_results([event["event_id"]], timeout=30)
    [result] = shard.received.results[event["event_id"]]
    assert result["status"] == Status.SAVED
