"""``worker check``: try every dependency with the current configuration and say what works.

For a person setting the worker up, or a deploy gate asking "can this worker run?": one line per dependency
(per node of a RabbitMQ cluster), what was tried and what answered, then a warning per setting that fell back
to its default; or, with ``--json``, the same as one JSON object for a script. Exit 0 when the worker can run:
Postgres and Redis work and at least one listed RabbitMQ node answers (the worker connects to the first that
does); every node that does not answer is a warning. ``--all-nodes``: every listed node must answer. Fallbacks
are warnings, never failures; an identity setting given a value it does not take is a failure (``setting``:
the worker would not start on it, worker/config/env.py ``refused_settings``).
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
from worker.config import Fallback, Note, Settings, connection_problems, expected_value, refused_settings
from worker.faults import explain
from worker.redact import redact_setting as redact
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


#: the setting each dependency is reached through
_SETTINGS = {"postgres": "postgres_dsn", "rabbitmq": "rabbitmq_url", "redis": "redis_url"}


async def run_checks(settings: Settings) -> list[CheckResult]:
    """Every dependency, each with its own timeout; a failure becomes a result naming the error.

    A URL that can never work is reported as it is (one line naming the variable) and not tried: the client
    libraries' errors about it quote what a password spilt into."""
    malformed = connection_problems(settings)
    checks: list[tuple[str, str, Callable[[Settings], Awaitable[CheckResult]]]] = []
    for name, field in _SETTINGS.items():
        value = getattr(settings, field)
        if field in malformed:
            checks.append((name, value, partial(_refused, malformed[field])))
        elif name == "rabbitmq":
            # one line per node of a cluster: the worker runs while one answers, so the others only warn
            # (judge), unless --all-nodes asks for every one
            checks += [(name, url, partial(check_rabbitmq_node, url)) for url in split_urls(value)]
        else:
            checks.append((name, value, check_postgres if name == "postgres" else check_redis))

    async def guarded(
        name: str, url: str, check: Callable[[Settings], Awaitable[CheckResult]]
    ) -> CheckResult:
        try:
            return await asyncio.wait_for(check(settings), timeout=TIMEOUT * 3)
        except Exception as exc:
            if isinstance(exc, _Malformed):
                return CheckResult(name, redact(url), False, str(exc))
            # explain() words a refusal, and describe() a refused TLS certificate, the same for every
            # dependency and every command
            if name == "postgres":
                return CheckResult(name, redact(url), False, describe_failure(exc, url))
            return CheckResult(name, redact(url), False, explain(exc, url))

    results = list(await asyncio.gather(*(guarded(*c) for c in checks)))
    # an identity setting given a value it does not take: the worker would not start on it
    results += [CheckResult("setting", var, False, why) for var, why in refused_settings(settings).items()]
    return results


class _Malformed(Exception):
    """A connection setting that can never work; the message names its variable."""


async def _refused(problem: str, settings: Settings) -> CheckResult:
    raise _Malformed(problem)


def fallback_line(fallback: Fallback) -> str:
    """``LTM_HTTP_PORT='notaport' is not a port number 0..65535 (...); using 0``, for people."""
    var, raw, default = fallback
    return f"{var}={raw!r} is not {expected_value(var)}; using {default!r}"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the results mean: the ones that fail the check, and the unanswered nodes that only warn."""

    failures: tuple[CheckResult, ...]
    warnings: tuple[CheckResult, ...]

    @property
    def ok(self) -> bool:
        return not self.failures


def judge(results: list[CheckResult], *, all_nodes: bool = False) -> Verdict:
    """A dependency fails when it does not work; a RabbitMQ cluster works when one listed node answers (the
    others are warnings), unless ``all_nodes`` asks for every one."""
    failures: list[CheckResult] = []
    warnings: list[CheckResult] = []
    for name in dict.fromkeys(r.dependency for r in results):
        found = [r for r in results if r.dependency == name]
        failed = [r for r in found if not r.ok]
        if failed and len(failed) < len(found) and not all_nodes:
            warnings += failed
        else:
            failures += failed
    return Verdict(tuple(failures), tuple(warnings))


def render(
    results: list[CheckResult],
    fallbacks: tuple[Fallback, ...] = (),
    notes: tuple[Note, ...] = (),
    *,
    all_nodes: bool = False,
) -> str:
    """The report for a terminal: a line pair per dependency (``warn`` for a node that did not answer while
    another did), a ``warn`` line per fallback and per note, the verdict."""
    verdict = judge(results, all_nodes=all_nodes)
    warned = {id(r) for r in verdict.warnings}
    lines = []
    for r in results:
        mark = "ok  " if r.ok else "warn" if id(r) in warned else "FAIL"
        lines.append(f"{mark}  {r.dependency:<9} {r.target}\n      {r.detail}")
    lines.extend(f"warn  {fallback_line(fallback)}" for fallback in fallbacks)
    lines.extend(f"warn  {note}" for _, note in notes)
    failed = list(dict.fromkeys(r.dependency for r in verdict.failures))
    said = []
    if verdict.warnings:
        nodes = sum(r.dependency == "rabbitmq" for r in results)
        said.append(
            f"{len(verdict.warnings)} of {nodes} RabbitMQ nodes did not answer; the worker runs on the "
            "others, --all-nodes fails on it"
        )
    if fallbacks:
        said.append(f"{len(fallbacks)} setting{'s' if len(fallbacks) > 1 else ''} fell back to the default")
    if notes:
        said.append(f"{len(notes)} other setting warning{'s' if len(notes) > 1 else ''}")
    verdict_line = "all dependencies work" if not failed else f"not working: {', '.join(failed)}"
    if said:
        verdict_line += f" ({'; '.join(said)})"
    lines.append(verdict_line)
    return "\n".join(lines)


def as_json(
    results: list[CheckResult],
    fallbacks: tuple[Fallback, ...] = (),
    notes: tuple[Note, ...] = (),
    *,
    all_nodes: bool = False,
) -> dict[str, Any]:
    """The report for a script (``worker check --json``); ``ok`` is the verdict the exit code gives,
    ``warnings`` the nodes that did not answer while another did (with ``--all-nodes`` they fail instead),
    ``fallbacks`` and ``notes`` the settings' warnings (never failures)."""
    verdict = judge(results, all_nodes=all_nodes)
    failing = {id(r) for r in verdict.failures}
    by_dependency: dict[str, list[CheckResult]] = {}
    for r in results:
        by_dependency.setdefault(r.dependency, []).append(r)
    return {
        "ok": verdict.ok,
        "dependencies": {name: _dependency_json(found, failing) for name, found in by_dependency.items()},
        "warnings": [
            {"dependency": r.dependency, "target": r.target, "problem": r.detail} for r in verdict.warnings
        ],
        "fallbacks": [
            {"variable": var, "value": raw, "default": default, "expected": expected_value(var)}
            for var, raw, default in fallbacks
        ],
        "notes": [{"variable": var, "note": note} for var, note in notes],
    }


def _dependency_json(found: list[CheckResult], failing: set[int]) -> dict[str, Any]:
    """One dependency's entry; several RabbitMQ nodes are one entry (ok when the verdict says the cluster
    works; ``problem`` names the failing nodes then) with a ``nodes`` list, the same fields per node."""
    entries = [
        {"ok": r.ok, "target": r.target, "detail": r.detail, "problem": None if r.ok else r.detail}
        for r in found
    ]
    if len(entries) == 1:
        return entries[0]
    problems = [f"{r.target}: {r.detail}" for r in found if id(r) in failing]
    return {
        "ok": not problems,
        "target": ",".join(str(e["target"]) for e in entries),
        "detail": "; ".join(f"{e['target']}: {e['detail']}" for e in entries),
        "problem": "; ".join(problems) or None,
        "nodes": entries,
    }
