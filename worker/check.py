"""``worker check``: try every dependency with the current configuration and say what works.

For a person setting the worker up: one line per dependency, what was tried and what answered.
Exit 0 when everything works, 1 otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aio_pika
import asyncpg
import redis.asyncio as aioredis

from worker.config import Settings
from worker.config import redact_url as redact
from worker.store.migrate import pending_migrations
from worker.store.pool import describe_failure

TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class CheckResult:
    dependency: str
    target: str
    ok: bool
    detail: str


async def check_postgres(settings: Settings) -> CheckResult:
    target = redact(settings.postgres_dsn)
    conn = await asyncpg.connect(settings.postgres_dsn, timeout=TIMEOUT)
    try:
        version = await conn.fetchval("SHOW server_version")
    finally:
        await conn.close()
    pending = await pending_migrations(settings.postgres_dsn)
    if pending:
        return CheckResult(
            "postgres", target, False, f"server {version}; run `worker migrate`: {', '.join(pending)}"
        )
    return CheckResult("postgres", target, True, f"server {version}; schema up to date")


async def check_rabbitmq(settings: Settings) -> CheckResult:
    target = redact(settings.rabbitmq_url)
    connection = await aio_pika.connect(settings.rabbitmq_url, timeout=TIMEOUT)
    try:
        server = connection.transport.connection.server_properties if connection.transport else {}
        version = server.get("version", "?")
        channel = await connection.channel()
        try:
            queue = await channel.declare_queue(settings.topology.work_queue, passive=True)
            depth = queue.declaration_result.message_count
            detail = f"server {version!s}; {settings.topology.work_queue} holds {depth} events"
        except aio_pika.exceptions.ChannelClosed:
            queue_name = settings.topology.work_queue
            detail = f"server {version!s}; {queue_name} not declared yet (`worker run` declares it)"
        return CheckResult("rabbitmq", target, True, detail)
    finally:
        await connection.close()


async def check_redis(settings: Settings) -> CheckResult:
    target = redact(settings.redis_url)
    client = aioredis.Redis.from_url(
        settings.redis_url, socket_connect_timeout=TIMEOUT, socket_timeout=TIMEOUT
    )
    try:
        info = await client.info("server")
        return CheckResult("redis", target, True, f"server {info.get('redis_version', '?')}")
    finally:
        await client.aclose()


async def run_checks(settings: Settings) -> list[CheckResult]:
    """Every dependency, each with its own timeout; a failure becomes a result naming the error."""
    checks: list[tuple[str, str, Callable[[Settings], Awaitable[CheckResult]]]] = [
        ("postgres", settings.postgres_dsn, check_postgres),
        ("rabbitmq", settings.rabbitmq_url, check_rabbitmq),
        ("redis", settings.redis_url, check_redis),
    ]

    async def guarded(
        name: str, url: str, check: Callable[[Settings], Awaitable[CheckResult]]
    ) -> CheckResult:
        try:
            return await asyncio.wait_for(check(settings), timeout=TIMEOUT * 3)
        except Exception as exc:
            if name == "postgres":
                return CheckResult(name, redact(url), False, describe_failure(exc))
            reason = " ".join(str(exc).split()) or type(exc).__name__
            return CheckResult(name, redact(url), False, f"{type(exc).__name__}: {reason}")

    return list(await asyncio.gather(*(guarded(*c) for c in checks)))


def render(results: list[CheckResult]) -> str:
    lines = []
    for r in results:
        mark = "ok  " if r.ok else "FAIL"
        lines.append(f"{mark}  {r.dependency:<9} {r.target}\n      {r.detail}")
    failed = [r.dependency for r in results if not r.ok]
    lines.append("all dependencies work" if not failed else f"not working: {', '.join(failed)}")
    return "\n".join(lines)
