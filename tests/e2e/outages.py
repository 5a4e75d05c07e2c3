"""Real faults for e2e tests: stop the broker, restart Redis, cut Postgres connections, slow Postgres down.

Stopping a service needs the local one (the servers this machine runs on 127.0.0.1): a test that gets
its services from elsewhere (containers, remote URLs) is skipped, since it cannot stop them. Every
helper restores what it broke and waits until the service answers again, also when the test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import asyncpg
import pytest
import redis.asyncio as aioredis

from tests.services import run_command

COMMAND_TIMEOUT = 60.0
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
REDIS_START = ["--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379"]
REDIS_START += ["--save", "", "--appendonly", "no"]


def _require_local(url: str, port: int, tool: str) -> str:
    parts = urlsplit(url)
    if parts.hostname not in LOCAL_HOSTS or (parts.port or port) != port:
        pytest.skip(f"needs the local server on port {port} to stop it, not {parts.hostname}:{parts.port}")
    executable = shutil.which(tool)
    if executable is None:
        pytest.skip(f"needs {tool} to stop the local server")
    return executable


async def run(*command: str, timeout: float = COMMAND_TIMEOUT, check: bool = True) -> str:
    """Run a command; its output. Fails the test on a non-zero exit (``check``) or a timeout."""
    try:
        code, text = await run_command(*command, timeout=timeout)
    except TimeoutError:
        raise AssertionError(f"{' '.join(command)} did not finish within {timeout}s") from None
    if check and code != 0:
        raise AssertionError(f"{' '.join(command)} exited {code}: {text}")
    return text


# -- RabbitMQ ----------------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def rabbitmq_stopped(url: str) -> AsyncIterator[None]:
    """``rabbitmqctl stop_app`` for the body of the block; ``start_app`` and ``await_startup`` after."""
    ctl = _require_local(url, 5672, "rabbitmqctl")
    await run(ctl, "stop_app")
    try:
        yield
    finally:
        await run(ctl, "start_app")
        await run(ctl, "await_startup")


# -- Redis -------------------------------------------------------------------------------------------------


async def restart_redis(url: str, *, down_for: float = 0.0, timeout: float = 30.0) -> None:
    """``SHUTDOWN NOSAVE``, stay down ``down_for`` seconds, then start the local server and wait for PING."""
    cli = _require_local(url, 6379, "redis-cli")
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("needs redis-server to start Redis again")
    try:
        # the server closes the connection as it goes down: a non-zero exit is expected
        await run(cli, "-h", "127.0.0.1", "-p", "6379", "shutdown", "nosave", check=False)
        deadline = time.monotonic() + timeout
        while await _redis_answers(url):
            if time.monotonic() > deadline:
                raise AssertionError(f"Redis still answers {timeout}s after SHUTDOWN NOSAVE")
            await asyncio.sleep(0.05)
        await asyncio.sleep(down_for)  # the outage itself
    finally:
        await ensure_redis(url, timeout)


async def ensure_redis(url: str, timeout: float = 30.0) -> None:
    """Start the local Redis unless it answers, and wait until it does."""
    if await _redis_answers(url):
        return
    server = shutil.which("redis-server") or "redis-server"
    await run(server, *REDIS_START)
    deadline = time.monotonic() + timeout
    while not await _redis_answers(url):
        if time.monotonic() > deadline:
            raise AssertionError(f"Redis did not answer PING within {timeout}s of starting it")
        await asyncio.sleep(0.05)


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
    """Terminate every other connection to ``conn``'s database (the workers'); how many there were."""
    terminated: int = await conn.fetchval(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    return terminated


@contextlib.asynccontextmanager
async def frozen_backends(conn: asyncpg.Connection, dsn: str) -> AsyncIterator[list[int]]:
    """Every other backend on ``conn``'s database (at ``dsn``) stopped with SIGSTOP for the block: a
    Postgres that neither answers nor hangs up. Continued (SIGCONT) on the way out, whatever happens."""
    if urlsplit(dsn).hostname not in LOCAL_HOSTS:
        pytest.skip("needs the local Postgres to freeze its backends")
    pids: list[int] = [
        row["pid"]
        for row in await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
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
