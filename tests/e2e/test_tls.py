"""The worker over TLS to Postgres, RabbitMQ and Redis, each a private server that accepts nothing else.

The servers (tests/e2e/tls.py) present certificates of a CA made for this module and want a client
certificate of the same CA; the worker's URLs verify them and present theirs the way docs/tls.md "TLS to
Postgres, RabbitMQ and Redis" says: ``sslmode=verify-full&sslrootcert=...&sslcert=...&sslkey=...``,
``amqps://...?cafile=...&certfile=...&keyfile=...``,
``rediss://...?ssl_ca_certs=...&ssl_certfile=...&ssl_keyfile=...``. A URL naming another CA is refused,
and the refusal is handled the same way for all three: ``worker check`` fails with "TLS certificate not
accepted"; ``worker run`` logs that at ERROR and keeps retrying, so a server whose certificate is replaced
(the two rotation tests) is used without restarting the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import aio_pika
import aiormq.exceptions
import asyncpg
import pytest
import redis
import redis.asyncio as aioredis

from contracts.models import invalidation_id
from tests.e2e.stack import Stack
from tests.e2e.tls import (
    Authority,
    Pair,
    TlsPostgres,
    TlsRabbit,
    TlsRedis,
    find_postgres_bin,
    find_rabbitmq_bin,
    find_redis_server,
)
from tests.factories import BotRows, event_body
from tests.support.harness import InvalidationListener, Shard, WorkerProcess
from worker.store.migrate import apply_migrations

pytestmark = pytest.mark.e2e

DEPENDENCIES = ("postgres", "rabbitmq", "redis")
#: the log event of a failed attempt, by dependency (Postgres and Redis are awaited before consuming)
RETRY_EVENT = {
    "postgres": "waiting for dependency",
    "redis": "waiting for dependency",
    "rabbitmq": "rabbitmq unavailable",
}


def _missing(what: str, install: str) -> None:
    message = f"{what} is not installed ({install}): the TLS tests start a private server of it"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


# -- servers, one set per module ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Authorities:
    good: Authority
    other: Authority
    server: Pair
    #: the worker's (and the tests') client certificate: every server here asks for one the good CA signed
    client: Pair


@pytest.fixture(scope="module")
def authorities(tmp_path_factory: pytest.TempPathFactory) -> Authorities:
    if shutil.which("openssl") is None:
        _missing("openssl", "apt-get install openssl")
    base = tmp_path_factory.mktemp("tls")
    good = Authority(base / "good", "good")
    return Authorities(good, Authority(base / "other", "other"), good.issue("server"), good.issue("client"))


def _postgres(authorities: Authorities) -> TlsPostgres:
    bin_dir = find_postgres_bin()
    if bin_dir is None:
        _missing("PostgreSQL server (initdb, postgres)", "apt-get install postgresql")
    assert bin_dir is not None
    return TlsPostgres(bin_dir, authorities.server, client_ca=authorities.good.ca)


def _redis(authorities: Authorities) -> TlsRedis:
    executable = find_redis_server()
    if executable is None:
        _missing("redis-server 6 or later (built with TLS)", "apt-get install redis-server")
    assert executable is not None
    return TlsRedis(executable, authorities.server, authorities.good.ca, client_certificates=True)


@pytest.fixture(scope="module")
def tls_postgres(authorities: Authorities) -> Iterator[TlsPostgres]:
    server = _postgres(authorities)
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture(scope="module")
def tls_rabbit(authorities: Authorities) -> Iterator[TlsRabbit]:
    bin_dir = find_rabbitmq_bin()
    if bin_dir is None:
        _missing("rabbitmq-server", "apt-get install rabbitmq-server")
    assert bin_dir is not None
    node = TlsRabbit(bin_dir, authorities.server, authorities.good.ca, client_certificates=True)
    try:
        yield node.start()
    finally:
        node.close()


@pytest.fixture(scope="module")
def tls_redis(authorities: Authorities) -> Iterator[TlsRedis]:
    server = _redis(authorities)
    try:
        yield server.start()
    finally:
        server.close()


# -- per test: a database, a vhost, and the URLs -------------------------------------------------------------


@dataclass
class TlsStack:
    """A :class:`Stack` whose URLs verify the servers with the good CA, and the same URLs with another CA."""

    stack: Stack
    wrong: dict[str, str]

    def env_with_wrong_ca(self, dependency: str) -> dict[str, str]:
        variable = {"postgres": "LTM_POSTGRES_DSN", "rabbitmq": "LTM_RABBITMQ_URL", "redis": "LTM_REDIS_URL"}
        return {variable[dependency]: self.wrong[dependency]}


@contextlib.asynccontextmanager
async def _database(server: TlsPostgres, ca: Path, client: Pair) -> AsyncIterator[str]:
    name = f"ltm_tls_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(server.dsn(ca=ca, client=client))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield name
    finally:
        with contextlib.suppress(Exception):
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@contextlib.asynccontextmanager
async def _tls_stack(
    postgres: TlsPostgres, rabbit: TlsRabbit, redis_server: TlsRedis, authorities: Authorities, log_dir: Path
) -> AsyncIterator[TlsStack]:
    good, other, client = authorities.good.ca, authorities.other.ca, authorities.client
    vhost = f"ltm-tls-{secrets.token_hex(4)}"
    await asyncio.to_thread(rabbit.add_vhost, vhost)
    try:
        async with _database(postgres, good, client) as database:
            dsn = postgres.dsn(database, ca=good, client=client)
            await apply_migrations(dsn)
            conn = await asyncpg.connect(dsn)
            amqps = rabbit.url(vhost, ca=good, client=client)
            stack = Stack(dsn, amqps, redis_server.url(ca=good, client=client), log_dir, BotRows(conn))
            wrong = {
                "postgres": postgres.dsn(database, ca=other, client=client),
                "rabbitmq": rabbit.url(vhost, ca=other, client=client),
                "redis": redis_server.url(ca=other, client=client),
            }
            try:
                yield TlsStack(stack, wrong)
            finally:
                for process in stack.workers:
                    process.kill()
                await conn.close()
    finally:
        await asyncio.to_thread(rabbit.delete_vhost, vhost)


@pytest.fixture
async def tls(
    tls_postgres: TlsPostgres,
    tls_rabbit: TlsRabbit,
    tls_redis: TlsRedis,
    authorities: Authorities,
    tmp_path: Path,
) -> AsyncIterator[TlsStack]:
    async with _tls_stack(tls_postgres, tls_rabbit, tls_redis, authorities, tmp_path) as stack:
        yield stack


def _certificate_errors(worker: WorkerProcess, event: str) -> list[dict[str, Any]]:
    return [
        line
        for line in worker.lines()
        if line.get("event") == event
        and line.get("level") == "error"
        and "TLS certificate not accepted" in str(line.get("problem") or line.get("error"))
    ]


async def _wait_for_certificate_errors(worker: WorkerProcess, event: str, at_least: int) -> None:
    deadline = asyncio.get_running_loop().time() + 60
    while len(_certificate_errors(worker, event)) < at_least:
        worker.check_alive()
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"no {at_least} certificate errors ({event!r}) in 60s:\n{worker.tail()}")
        await asyncio.sleep(0.1)


async def _stop(worker: WorkerProcess) -> int | None:
    assert worker.proc is not None
    worker.proc.send_signal(signal.SIGTERM)
    return await asyncio.to_thread(worker.proc.wait, 30)


# -- the tests -----------------------------------------------------------------------------------------------


async def _open_and_close(amqp_url: str) -> None:
    connection = await aio_pika.connect(amqp_url, timeout=10)
    await connection.close()


async def test_the_servers_accept_nothing_but_tls_with_a_client_certificate(
    tls: TlsStack,
    tls_postgres: TlsPostgres,
    tls_rabbit: TlsRabbit,
    tls_redis: TlsRedis,
    authorities: Authorities,
) -> None:
    """Without this, a test below passing could mean the worker spoke plaintext, or sent no certificate."""
    database = urlsplit(tls.stack.postgres_dsn).path.lstrip("/")
    vhost = unquote(urlsplit(tls.stack.rabbitmq_url).path.lstrip("/"))
    good = authorities.good.ca
    plain_dsn = tls_postgres.dsn(database, sslmode="disable")
    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError, match="no encryption"):
        await asyncpg.connect(plain_dsn)
    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError, match="certificate"):
        await asyncpg.connect(tls_postgres.dsn(database, ca=good))
    plain_amqp = tls_rabbit.url(vhost).replace("amqps://", "amqp://")
    for url in (plain_amqp, tls_rabbit.url(vhost, ca=good)):
        with pytest.raises((aiormq.exceptions.AMQPConnectionError, ConnectionError)):
            await _open_and_close(url)
    for url in (f"redis://127.0.0.1:{tls_redis.port}/0", tls_redis.url(ca=good)):
        client = aioredis.Redis.from_url(url, socket_timeout=10)
        try:
            with pytest.raises(redis.exceptions.ConnectionError):
                await client.ping()
        finally:
            await client.aclose()


async def test_worker_check_and_migrate_over_tls(tls: TlsStack) -> None:
    migrate = await asyncio.to_thread(tls.stack.cli, "migrate")
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    done = await asyncio.to_thread(tls.stack.cli, "check", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True
    assert report["dependencies"]["rabbitmq"]["target"].startswith("amqps://")
    assert report["dependencies"]["redis"]["target"].startswith("rediss://")
    assert "sslmode=verify-full" in report["dependencies"]["postgres"]["target"]


async def test_worker_runs_end_to_end_over_tls(tls: TlsStack, tls_rabbit: TlsRabbit) -> None:
    stack = tls.stack
    world = await stack.rows.world()
    stack.worker()
    await stack.workers_ready()
    body = event_body({"memory_content": "{user} likes TLS", "memory_scope": "server_wide"},
                      persona_id=world.persona_id)  # fmt: skip
    event_id = body["event_id"]
    async with Shard(stack.rabbitmq_url) as shard, InvalidationListener(stack.redis_url) as listener:
        await shard.publish(body)
        await shard.wait_for_results([event_id], timeout=60)
        deadline = asyncio.get_running_loop().time() + 30
        while not (listener.of(event_id) and shard.received.notices[event_id]):
            assert asyncio.get_running_loop().time() < deadline, "no invalidation or notice in 30s"
            await asyncio.sleep(0.05)

    [result] = shard.received.results[event_id]
    assert result["success"] is True, result
    memory_id = result["data"]["memory_id"]
    saved = "SELECT content FROM server_memories WHERE server_memory_id = $1"
    assert await stack.rows.conn.fetchval(saved, memory_id) == "{user} likes TLS"
    assert listener.of(event_id)[0]["invalidation_id"] == invalidation_id(uuid.UUID(event_id))

    # the worker's own sessions: encrypted, as every session of this server must be
    database = urlsplit(stack.postgres_dsn).path.lstrip("/")
    sessions = await stack.rows.conn.fetch(
        "SELECT s.ssl, s.version FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
        "WHERE a.datname = $1 AND a.pid <> pg_backend_pid()",
        database,
    )
    assert sessions, "the worker holds no Postgres session"
    assert all(row["ssl"] for row in sessions), sessions
    vhost = unquote(urlsplit(stack.rabbitmq_url).path.lstrip("/"))
    listed = await asyncio.to_thread(
        tls_rabbit.ctl, tls_rabbit.node, "list_connections", "vhost", "ssl", "--formatter", "json"
    )
    connections = [row for row in json.loads(listed) if row["vhost"] == vhost]
    assert connections, listed
    assert all(row["ssl"] is True for row in connections), connections
    assert await _stop(stack.workers[0]) == 0


@pytest.mark.parametrize("dependency", DEPENDENCIES)
async def test_check_refuses_a_server_certificate_of_another_ca(tls: TlsStack, dependency: str) -> None:
    done = await asyncio.to_thread(tls.stack.cli, "check", **tls.env_with_wrong_ca(dependency))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    failed = [i for i, line in enumerate(lines) if line.startswith("FAIL") and dependency in line]
    assert len(failed) == 1, done.stdout
    detail = lines[failed[0] + 1]
    assert "TLS certificate not accepted" in detail, done.stdout
    assert "certificate verify failed" in detail, done.stdout
    others = [name for name in DEPENDENCIES if name != dependency]
    assert all(any(line.startswith("ok") and name in line for line in lines) for name in others), done.stdout


@pytest.mark.parametrize("dependency", DEPENDENCIES)
async def test_run_retries_a_refused_certificate_and_says_so(tls: TlsStack, dependency: str) -> None:
    """The same for every dependency: an ERROR naming the certificate at every attempt, the worker waits
    (no exit), and a SIGTERM stops it cleanly."""
    worker = tls.stack.worker(**tls.env_with_wrong_ca(dependency))
    event = RETRY_EVENT[dependency]
    await _wait_for_certificate_errors(worker, event, at_least=2)
    [first, *_] = _certificate_errors(worker, event)
    if event == "waiting for dependency":
        assert first["dependency"] == dependency
    assert worker.running
    assert worker.count("consuming") == 0
    assert await _stop(worker) == 0, worker.tail()


@pytest.mark.parametrize("dependency", ["postgres", "redis"])
async def test_a_waiting_worker_uses_a_server_whose_certificate_was_replaced(
    tls_rabbit: TlsRabbit, authorities: Authorities, tmp_path: Path, dependency: str
) -> None:
    """Why a refused certificate is retried rather than fatal: the worker trusts the other CA; the server
    (one of this test's own) then gets a certificate of that CA, and the worker goes on without a restart.
    Postgres re-reads its certificate on SIGHUP, Redis on ``CONFIG SET tls-cert-file``."""
    postgres, redis_server = _postgres(authorities), _redis(authorities)
    try:
        postgres.start()
        redis_server.start()
        async with _tls_stack(postgres, tls_rabbit, redis_server, authorities, tmp_path) as tls:
            worker = tls.stack.worker(**tls.env_with_wrong_ca(dependency))
            await _wait_for_certificate_errors(worker, "waiting for dependency", at_least=1)
            replacement = authorities.other.issue(f"replacement-{dependency}")
            if dependency == "postgres":
                postgres.replace_certificate(replacement)
            else:
                await asyncio.to_thread(redis_server.replace_certificate, replacement, authorities.client)
            await worker.wait_for_log("consuming", timeout=60)
            assert await _stop(worker) == 0, worker.tail()
    finally:
        postgres.close()
        redis_server.close()
