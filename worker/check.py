"""``worker check``: try every dependency with the current configuration and say what works.

For a person setting the worker up: one line per dependency, what was tried and what answered, then a
warning per setting that fell back to its default; or, with ``--json``, the same as one JSON object for a
script. Exit 0 when every dependency works (fallbacks are warnings, not failures), 1 otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aio_pika
import asyncpg
import redis.asyncio as aioredis

from worker.config import Settings, expected_value
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


Fallback = tuple[str, str, int | str]


def fallback_line(fallback: Fallback) -> str:
    """``LTM_HTTP_PORT='notaport' is not a port number 0..65535 (...); using 0``, for people."""
    var, raw, default = fallback
    return f"{var}={raw!r} is not {expected_value(var)}; using {default!r}"


def render(results: list[CheckResult], fallbacks: tuple[Fallback, ...] = ()) -> str:
    """The report for a terminal: a line pair per dependency, a ``warn`` line per fallback, the verdict."""
    lines = []
    for r in results:
        mark = "ok  " if r.ok else "FAIL"
        lines.append(f"{mark}  {r.dependency:<9} {r.target}\n      {r.detail}")
    lines.extend(f"warn  {fallback_line(fallback)}" for fallback in fallbacks)
    failed = [r.dependency for r in results if not r.ok]
    verdict = "all dependencies work" if not failed else f"not working: {', '.join(failed)}"
    if fallbacks:
        verdict += f" ({len(fallbacks)} setting{'s' if len(fallbacks) > 1 else ''} fell back to the default)"
    lines.append(verdict)
    return "\n".join(lines)


def as_json(results: list[CheckResult], fallbacks: tuple[Fallback, ...] = ()) -> dict[str, Any]:
    """The report for a script (``worker check --json``); ``ok`` is the verdict the exit code gives."""
    return {
        "ok": all(r.ok for r in results),
        "dependencies": {
            r.dependency: {
                "ok": r.ok,
                "target": r.target,
                "detail": r.detail,
                "problem": None if r.ok else r.detail,
            }
            for r in results
        },
        "fallbacks": [
            {"variable": var, "value": raw, "default": default, "expected": expected_value(var)}
            for var, raw, default in fallbacks
        ],
    }
