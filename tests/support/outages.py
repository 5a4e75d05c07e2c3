"""Real faults for e2e tests, on servers of the test's own: stop a broker, restart a Redis, cut or freeze a
database's connections, slow Postgres down.

Nothing here stops, restarts or reconfigures a service the suite found running (the machine's RabbitMQ,
Redis and Postgres, or the containers the suite uses): other programs on the machine (a developer's worker
and shard, another test run) stay connected. A broker outage (``rabbitmq_stopped`` in tests/e2e/cluster.py)
stops the app of a private RabbitMQ node (``private_broker`` in tests/e2e/conftest.py: one node for the
session, each test on its own vhost there); a Redis outage shuts down a private ``redis-server`` the test
started on a free port (:class:`PrivateRedis`); the Postgres faults touch only the client connections to
the test's own database (``ltm_test_<hex>``) and triggers on its tables. Every helper restores what it
broke and waits until the service answers again, also when the test fails. ``tests/conftest.py`` warns
when the machine's services restarted during a run anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest
import redis.asyncio as aioredis

from worker.testing.workers import free_port

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
#: Postgres faults hit only the connections of clients (the workers), never the server's own processes
CLIENT_BACKENDS = (
    "datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
)


# -- Redis -------------------------------------------------------------------------------------------------


class PrivateRedis:
    """A ``redis-server`` of the test's own on a free loopback port, without persistence (``--save ""
    --appendonly no``), its files and log in ``directory``; :meth:`restart` is the outage, :meth:`close`
    kills it."""

    def __init__(self, executable: str, directory: Path) -> None:
        self.executable = executable
        self.dir = directory
        self.port = free_port()
        self.log = directory / "redis.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self, timeout: float = 30.0) -> PrivateRedis:
        """Start the server (on the same port again after a restart) and wait until it answers PING."""
        proc = await asyncio.to_thread(self._launch)
        deadline = time.monotonic() + timeout
        while not await _redis_answers(self.url):
            where = f"redis-server on port {self.port}"
            if proc.poll() is not None:
                raise AssertionError(f"{where} exited: {self.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{where} did not answer PING within {timeout}s")
            await asyncio.sleep(0.05)
        return self

    def _launch(self) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    self.executable,
                    "--port", str(self.port),
                    "--bind", "127.0.0.1",
                    "--save", "",
                    "--appendonly", "no",
                    "--dir", str(self.dir),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        return self.proc

    async def restart(self, *, down_for: float = 0.0) -> None:
        """Shut the server down (SIGTERM: what ``SHUTDOWN NOSAVE`` does without persistence; every client
        loses its connection), stay down ``down_for`` seconds, start it again and wait for PING."""
        try:
            await asyncio.to_thread(self.stop)
            await asyncio.sleep(down_for)  # the outage itself
        finally:
            await self.start()

    def stop(self) -> None:
        """Stop the server and wait for it (SIGKILL when it takes longer than 30 s)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.proc = None

    def close(self) -> None:
        self.stop()


def find_redis_server() -> str:
    """``redis-server``; the test is skipped without it (failed under CI, which installs it)."""
    executable = shutil.which("redis-server")
    if executable is None:
        message = "redis-server is not installed: the test starts a Redis of its own"
        if os.environ.get("CI"):
            pytest.fail(message + " (CI must install it)")
        pytest.skip(message)
    return executable


async def _redis_answers(url: str) -> bool:
    client = aioredis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(await client.ping())
    except Exception:
        return False
    finally:
        await client.aclose()


# -- Postgres ----------------------------------------------------------------------------------------------


async def terminate_backends(conn: asyncpg.Connection) -> int:
    """Terminate every other client connection to ``conn``'s database (the workers'); how many there were."""
    terminated: int = await conn.fetchval(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
        f" WHERE {CLIENT_BACKENDS}"
    )
    return terminated


@contextlib.asynccontextmanager
async def frozen_backends(conn: asyncpg.Connection, dsn: str) -> AsyncIterator[list[int]]:
    """Every other client backend on ``conn``'s database (at ``dsn``) stopped with SIGSTOP for the block: a
    Postgres that neither answers nor hangs up. Continued (SIGCONT) on the way out, whatever happens. Only
    client backends (no autovacuum or parallel worker, which could hold locks other databases wait on)."""
    if urlsplit(dsn).hostname not in LOCAL_HOSTS:
        pytest.skip("needs the local Postgres to freeze its backends")
    pids: list[int] = [
        row["pid"] for row in await conn.fetch(f"SELECT pid FROM pg_stat_activity WHERE {CLIENT_BACKENDS}")
    ]
    assert pids, "no other backend on the test database to freeze"
    stopped: list[int] = []
    try:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGSTOP)
            except PermissionError:
                pytest.skip("not allowed to signal the Postgres server's processes")
            stopped.append(pid)
        yield pids
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


async def slow_down(conn: asyncpg.Connection, table: str, seconds: float, event: str = "INSERT") -> None:
    """Make every ``event`` on ``table`` take ``seconds`` longer (a trigger calling ``pg_sleep``).

    Only the test's own database is touched. ``table`` and ``event`` are test constants, never input.
    """
    await conn.execute(
        f"""
        CREATE OR REPLACE FUNCTION ltm_test_slow_down() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN PERFORM pg_sleep({float(seconds)}); RETURN NEW; END $$;
        CREATE TRIGGER ltm_test_slow_down BEFORE {event} ON {table}
            FOR EACH ROW EXECUTE FUNCTION ltm_test_slow_down();
        """
    )


class Gate:
    """Holds every ``INSERT`` on a table inside Postgres until the test opens the gate.

    A trigger takes a shared advisory lock that the test holds exclusively: a save reaches the trigger
    (inside its transaction, the scope lock held) and waits there, as long as the test likes. Advisory
    locks belong to one database, so only the test's own database is affected.
    """

    KEY = 7_312_001

    def __init__(self, conn: asyncpg.Connection, table: str) -> None:
        self.conn = conn
        self.table = table

    async def close(self) -> None:
        """Install the trigger and hold the lock: saves stop at the gate."""
        await self.conn.execute("SELECT pg_advisory_lock($1)", self.KEY)
        await self.conn.execute(
            f"""
            CREATE OR REPLACE FUNCTION ltm_test_gate() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_advisory_xact_lock_shared({self.KEY}); RETURN NEW; END $$;
            CREATE TRIGGER ltm_test_gate BEFORE INSERT ON {self.table}
                FOR EACH ROW EXECUTE FUNCTION ltm_test_gate();
            """
        )

    async def open(self) -> None:
        """Let every waiting and future save through."""
        await self.conn.execute("SELECT pg_advisory_unlock($1)", self.KEY)

    async def wait_for_waiters(self, n: int, timeout: float = 30.0) -> None:
        """Wait until at least ``n`` transactions are stuck on an advisory lock: at the gate, or behind a
        save at the gate on their scope lock."""
        deadline = time.monotonic() + timeout
        while (waiting := await self.waiters()) < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"{waiting} transactions wait at the gate, not {n}, after {timeout}s")
            await asyncio.sleep(0.05)

    async def waiters(self) -> int:
        count: int = await self.conn.fetchval(
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
            " WHERE d.datname = current_database() AND l.locktype = 'advisory' AND NOT l.granted"
        )
        return count
