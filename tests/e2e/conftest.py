"""An isolated stack per test: a migrated database, a vhost, Redis, and worker processes on them."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import pytest

from tests.e2e.pgbouncer import PgBouncer, find_pgbouncer
from tests.e2e.stack import Stack
from tests.factories import BotRows
from tests.support.outages import PrivateRedis, find_redis_server
from worker.store.migrate import apply_migrations

if TYPE_CHECKING:
    from tests.e2e.cluster import RabbitCluster


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``pgbouncer`` runs twice: its workers straight to Postgres, then through PgBouncer."""
    if "stack" in metafunc.fixturenames and metafunc.definition.get_closest_marker("pgbouncer"):
        metafunc.parametrize("postgres_route", ["direct", "pgbouncer"], indirect=True)


@pytest.fixture
def postgres_route(request: pytest.FixtureRequest, postgres_dsn: str) -> Iterator[PgBouncer | None]:
    """None (workers connect to Postgres), or a PgBouncer of this test's own in transaction pooling mode,
    with fewer server connections than the test's workers (tests/e2e/pgbouncer.py)."""
    if getattr(request, "param", "direct") == "direct":
        yield None
        return
    executable = find_pgbouncer()
    if executable is None:
        message = "pgbouncer is not installed: `apt-get install pgbouncer` (.ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    bouncer = PgBouncer(executable, postgres_dsn).start()
    try:
        yield bouncer
    finally:
        bouncer.close()


@pytest.fixture
async def stack(
    postgres_dsn: str,
    rabbitmq_url: str,
    redis_url: str,
    tmp_path: Path,
    postgres_route: PgBouncer | None,
) -> AsyncIterator[Stack]:
    # the workers (and the migration) go through PgBouncer when routed there; the test's own connection
    # for rows and checks goes straight to Postgres
    workers_dsn = postgres_dsn if postgres_route is None else postgres_route.through(postgres_dsn)
    await apply_migrations(workers_dsn)
    conn = await asyncpg.connect(postgres_dsn)
    stack = Stack(workers_dsn, rabbitmq_url, redis_url, tmp_path, BotRows(conn))
    try:
        yield stack
    finally:
        for process in stack.workers:
            process.kill()
        await conn.close()


# -- servers of the tests' own, for outages (tests/support/outages.py): the machine's are never stopped --


@pytest.fixture(scope="session")
def private_broker() -> Iterator[RabbitCluster]:
    """One private RabbitMQ node (tests/e2e/cluster.py) for the session's tests that stop a broker or raise
    an alarm on it: booted the first time a test asks (about 6 s), stopped and removed at the end of the
    session. Each test gets its own vhost there (``private_broker_stack``); a test that stops the node's
    app starts it again before the next one runs."""
    from tests.e2e.cluster import private_rabbitmq

    with private_rabbitmq(1, why="tests that stop a broker use a node of their own") as broker:
        yield broker


@pytest.fixture
async def private_broker_stack(
    private_broker: RabbitCluster, postgres_dsn: str, redis_url: str, tmp_path: Path
) -> AsyncIterator[Stack]:
    """A stack whose broker is ``private_broker`` (a vhost of the test's own there, deleted after)."""
    from tests.e2e.cluster import stack_on

    async with stack_on(private_broker, postgres_dsn, redis_url, tmp_path) as stack:
        yield stack


@pytest.fixture
async def private_redis(tmp_path: Path) -> AsyncIterator[PrivateRedis]:
    """A ``redis-server`` of the test's own on a free port (no persistence), killed after the test."""
    directory = tmp_path / "redis"
    directory.mkdir()
    server = PrivateRedis(find_redis_server(), directory)
    try:
        yield await server.start()
    finally:
        server.close()
