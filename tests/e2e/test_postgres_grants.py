"""deploy/postgres/grants.sql, run with psql as documented, on a database where the bot's tables already exist
(owned by another role, as in the bot's database): `worker migrate` as the migrate role and `worker run` as
the run role save the contract's example, the run role can do nothing more to the bot's tables, and a table
a later migration adds is usable by the run role without granting anything again.

The roles are cluster-wide, so each test makes its own (``ltm_migrate_<hex>``, ``ltm_run_<hex>``, through
the file's ``-v migrate_role=... -v run_role=...``) and drops them after its database.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from contracts.models import Status
from tests.support.harness import REPO, Shard, WorkerProcess
from worker.ops.demo import example_event
from worker.ops.demo import seed as demo_seed

pytestmark = pytest.mark.e2e

GRANTS = REPO / "deploy" / "postgres" / "grants.sql"
BOT_TABLES = REPO / "worker" / "store" / "migrations" / "0001_bot_tables.sql"


def as_role(dsn: str, role: str, database: str) -> str:
    """``dsn`` (a trust-authenticated server) for ``role`` on ``database``."""
    parts = urlsplit(dsn)
    host = parts.hostname or "127.0.0.1"
    netloc = f"{role}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, f"/{database}", parts.query, ""))


@dataclass
class Granted:
    admin_dsn: str
    database: str
    migrate_role: str
    run_role: str
    psql: str

    def dsn(self, role: str) -> str:
        return as_role(self.admin_dsn, role, self.database)


def run_grants(psql: str, dsn: str, migrate_role: str, run_role: str) -> subprocess.CompletedProcess[str]:
    """The file as deploy/README.md runs it, with this test's role names."""
    arguments = ["-v", "ON_ERROR_STOP=1", "-v", f"migrate_role={migrate_role}", "-v", f"run_role={run_role}"]
    return subprocess.run(
        [psql, dsn, *arguments, "-f", str(GRANTS)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
async def granted(postgres_dsn: str) -> AsyncIterator[Granted]:
    """The test's database holding the bot's tables (owned by the admin role, the bot's stand-in) and its
    rows, the grants file run on it with psql, two fresh login roles; the roles dropped after."""
    psql = shutil.which("psql")
    if psql is None:
        message = "psql is not installed (postgresql-client; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    suffix = uuid.uuid4().hex[:10]
    database = urlsplit(postgres_dsn).path.lstrip("/")
    state = Granted(postgres_dsn, database, f"ltm_migrate_{suffix}", f"ltm_run_{suffix}", psql)
    admin = await asyncpg.connect(postgres_dsn)
    try:
        await admin.execute(BOT_TABLES.read_text(encoding="utf-8"))  # the bot's existing tables
        assert await demo_seed(postgres_dsn, out=lambda _: None) == 0
        done = await asyncio.to_thread(run_grants, psql, postgres_dsn, state.migrate_role, state.run_role)
        assert done.returncode == 0, done.stderr
        for role in (state.migrate_role, state.run_role):
            await admin.execute(f'ALTER ROLE "{role}" LOGIN')
        yield state
    finally:
        # roles are cluster-wide: what they own and were granted here goes first, then the roles
        for role in (state.migrate_role, state.run_role):
            if await admin.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", role):
                await admin.execute(f'DROP OWNED BY "{role}" CASCADE')
                await admin.execute(f'DROP ROLE "{role}"')
        await admin.close()


def worker_env(dsn: str, rabbitmq_url: str, redis_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LTM_", "MAX_"))}
    env.update(
        LTM_POSTGRES_DSN=dsn,
        LTM_RABBITMQ_URL=rabbitmq_url,
        LTM_REDIS_URL=redis_url,
        LTM_LOG_FORMAT="json",
        PYTHONUNBUFFERED="1",
    )
    return env


async def test_the_two_roles_migrate_and_save_with_exactly_the_grants_of_the_file(
    granted: Granted, rabbitmq_url: str, redis_url: str, tmp_path: Path
) -> None:
    migrate = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "worker", "migrate"],
        env=worker_env(granted.dsn(granted.migrate_role), rabbitmq_url, redis_url),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert migrate.returncode == 0, migrate.stderr

    worker = WorkerProcess(
        worker_env(granted.dsn(granted.run_role), rabbitmq_url, redis_url), tmp_path / "worker.log"
    ).start()
    try:
        await worker.wait_for_log("consuming", timeout=60)
        server_wide, personal = example_event("server_wide"), example_event("target_user")
        async with Shard(rabbitmq_url) as shard:
            await shard.publish(server_wide)
            await shard.publish(personal)
            await shard.wait_for_results([server_wide["event_id"], personal["event_id"]], timeout=60)
    finally:
        worker.kill()

    for event in (server_wide, personal):
        [result] = shard.received.results[event["event_id"]]
        assert result["status"] == Status.SAVED, result
    bot = await asyncpg.connect(granted.admin_dsn)
    try:
        assert await bot.fetchval("SELECT count(*) FROM server_memories") == 1
        assert await bot.fetchval("SELECT count(*) FROM personal_memories") == 1
    finally:
        await bot.close()
    owner = await asyncpg.connect(granted.dsn(granted.migrate_role))
    try:
        # a later migration's table, created by the migrate role, is usable by the run role as it stands
        await owner.execute("CREATE TABLE ltm_later_migration (id bigserial PRIMARY KEY, note text)")
    finally:
        await owner.close()

    run = await asyncpg.connect(granted.dsn(granted.run_role))
    try:
        await run.execute("INSERT INTO ltm_later_migration (note) VALUES ('reachable')")
        assert await run.fetchval("SELECT note FROM ltm_later_migration") == "reachable"
        # and nothing more than the file grants: no change to a bot row, no DDL
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await run.execute("UPDATE users SET privacy_level = 0")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await run.execute("DELETE FROM server_memories")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await run.execute("CREATE TABLE ltm_not_allowed (id int)")
    finally:
        await run.close()


async def test_the_file_runs_again_after_a_migrate_and_covers_what_that_migrate_made(
    granted: Granted,
) -> None:
    """Re-running the file (a second operator, a later upgrade) fails nothing, and the worker's objects an
    earlier migrate made are the run role's to use."""
    migrate = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "worker", "migrate"],
        env=worker_env(granted.dsn(granted.migrate_role), "amqp://unused/", "redis://unused/0"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert migrate.returncode == 0, migrate.stderr

    again = await asyncio.to_thread(
        run_grants, granted.psql, granted.admin_dsn, granted.migrate_role, granted.run_role
    )

    assert again.returncode == 0, again.stderr
    run = await asyncpg.connect(granted.dsn(granted.run_role))
    try:
        assert await run.fetchval("SELECT count(*) FROM ltm_processed_events") == 0
        assert await run.fetchval("SELECT count(*) FROM ltm_schema_migrations") > 0
        assert await run.fetchval(
            "SELECT bool_and(has_function_privilege(oid, 'EXECUTE')) FROM pg_proc WHERE proname LIKE 'ltm_%'"
        )
    finally:
        await run.close()
