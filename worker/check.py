"""``worker check``: try every dependency with the current configuration and say what works.

For a person setting the worker up: one line per dependency, what was tried and what answered, then a
warning per setting that fell back to its default; or, with ``--json``, the same as one JSON object for a
script. Exit 0 when every dependency works (fallbacks are warnings, not failures), 1 otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import aio_pika
import redis.asyncio as aioredis

from worker.broker.urls import split_urls
from worker.config import Fallback, Settings, expected_value
from worker.config import redact_url as redact
from worker.faults import certificate_failure
from worker.store.migrate import pending_migrations
from worker.store.pool import connect_once, describe_failure

TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class CheckResult:
    dependency: str
    target: str
    ok: bool
    detail: str


async def check_postgres(settings: Settings) -> CheckResult:
    target = redact(settings.postgres_dsn)
    conn = await connect_once(settings.postgres_dsn, timeout=TIMEOUT)
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


async def check_rabbitmq_node(url: str, settings: Settings) -> CheckResult:
    """One RabbitMQ node: its version and the work queue's depth as that node sees it."""
    target = redact(url)
    connection = await aio_pika.connect(url, timeout=TIMEOUT)
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
        # one line per node of a cluster: a node that does not answer fails the check (the worker itself
        # runs on the others, but the operator asked whether the configuration works as written)
        *(("rabbitmq", url, partial(check_rabbitmq_node, url)) for url in split_urls(settings.rabbitmq_url)),
        ("redis", settings.redis_url, check_redis),
    ]

    async def guarded(
        name: str, url: str, check: Callable[[Settings], Awaitable[CheckResult]]
    ) -> CheckResult:
        try:
            return await asyncio.wait_for(check(settings), timeout=TIMEOUT * 3)
        except Exception as exc:
            # a refused TLS certificate reads the same for every dependency ("TLS certificate not accepted")
            if name == "postgres" or certificate_failure(exc) is not None:
                return CheckResult(name, redact(url), False, describe_failure(exc))
            reason = " ".join(str(exc).split()) or type(exc).__name__
            return CheckResult(name, redact(url), False, f"{type(exc).__name__}: {reason}")

    return list(await asyncio.gather(*(guarded(*c) for c in checks)))


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
    failed = list(dict.fromkeys(r.dependency for r in results if not r.ok))
    verdict = "all dependencies work" if not failed else f"not working: {', '.join(failed)}"
    if fallbacks:
        verdict += f" ({len(fallbacks)} setting{'s' if len(fallbacks) > 1 else ''} fell back to the default)"
    lines.append(verdict)
    return "\n".join(lines)


def as_json(results: list[CheckResult], fallbacks: tuple[Fallback, ...] = ()) -> dict[str, Any]:
    """The report for a script (``worker check --json``); ``ok`` is the verdict the exit code gives."""
    by_dependency: dict[str, list[CheckResult]] = {}
    for r in results:
        by_dependency.setdefault(r.dependency, []).append(r)
    return {
        "ok": all(r.ok for r in results),
        "dependencies": {name: _dependency_json(found) for name, found in by_dependency.items()},
        "fallbacks": [
            {"variable": var, "value": raw, "default": default, "expected": expected_value(var)}
            for var, raw, default in fallbacks
        ],
    }


def _dependency_json(found: list[CheckResult]) -> dict[str, Any]:
    """One dependency's entry; several RabbitMQ nodes are one entry (ok when every node is) with a ``nodes``
    list, the same fields per node."""
    entries = [
        {"ok": r.ok, "target": r.target, "detail": r.detail, "problem": None if r.ok else r.detail}
        for r in found
    ]
    if len(entries) == 1:
        return entries[0]
    problems = [f"{e['target']}: {e['problem']}" for e in entries if e["problem"]]
    return {
        "ok": all(e["ok"] for e in entries),
        "target": ",".join(str(e["target"]) for e in entries),
        "detail": "; ".join(f"{e['target']}: {e['detail']}" for e in entries),
        "problem": "; ".join(problems) or None,
        "nodes": entries,
    }
