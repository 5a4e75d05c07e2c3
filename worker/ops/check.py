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
import base64
import json
import re
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import aio_pika
import redis.asyncio as aioredis

from worker.broker.urls import split_urls, vhost_of
from worker.config import Fallback, Note, Settings, connection_problems, expected_value, refused_settings
from worker.faults import explain
from worker.redact import describe
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


# --- the shards' own queues (security review 5, N-E) -------------------------------------------------------

#: a shard's own queues, CONTRACT.md section 2: ``tomori.shard.<id>.results`` and ``.notifications``
SHARD_QUEUE = re.compile(r"tomori\.shard\.(0|[1-9][0-9]*)\.(results|notifications)")
#: the arguments that make a queue hand its messages on elsewhere (an exchange, a routing key, a strategy)
DEAD_LETTER_ARGUMENT = "x-dead-letter-"
#: what ``worker check`` says when it is not given the management API
SHARD_QUEUES_SKIPPED = (
    "not checked for dead-letter arguments: AMQP cannot read a queue's arguments, only RabbitMQ's management "
    "API can (give --management-url; the user needs the management or monitoring tag)"
)
#: the management API is the broker's own: reached directly, never through an HTTP proxy
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def shard_queue_findings(queues: Iterable[Mapping[str, Any]]) -> tuple[int, list[str]]:
    """How many of ``queues`` (the management API's rows: ``name``, ``arguments``) are a shard's own, and one
    line per such queue that carries a dead-letter argument: a shard that declares its queue with
    ``x-dead-letter-exchange: tomori.tool_calls`` and another shard's routing key makes every result and
    notice of its own land in that shard's queue (RabbitMQ checks write permission on the dead-letter
    exchange, not the topic permission of the routing key). A shard's queues carry no dead-letter
    arguments (CONTRACT.md section 2)."""
    count = 0
    findings = []
    for queue in queues:
        name = str(queue.get("name", ""))
        if not SHARD_QUEUE.fullmatch(name):
            continue
        count += 1
        arguments = queue.get("arguments") or {}
        found = sorted(key for key in arguments if str(key).startswith(DEAD_LETTER_ARGUMENT))
        if found:
            given = ", ".join(f"{key}={arguments[key]!r}" for key in found)
            findings.append(f"{name} has {given}: its messages go on elsewhere")
    return count, findings


def _management_target(management_url: str, amqp_url: str) -> tuple[str, str, str]:
    """The API's base URL and the credentials to call it with: the management URL's own, else the AMQP URL's
    (the worker's user: aio-pika's ``guest`` when it names none)."""
    parts = urlsplit(management_url)
    amqp = urlsplit(amqp_url)
    user = unquote(parts.username if parts.username else amqp.username or "guest")
    password = unquote(
        parts.password
        if parts.password is not None
        else amqp.password
        if amqp.password is not None
        else "guest"
    )
    base = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2], query="", fragment=""))
    return base.rstrip("/"), user, password


def _list_queues(base: str, user: str, password: str, vhost: str) -> list[dict[str, Any]]:
    """``GET /api/queues/<vhost>?columns=name,arguments`` (blocking)."""
    request = urllib.request.Request(f"{base}/api/queues/{quote(vhost, safe='')}?columns=name,arguments")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    try:
        with _NO_PROXY.open(request, timeout=TIMEOUT) as response:
            answer = json.loads(response.read())
    except ValueError:
        raise _Malformed("the management API's answer is not JSON: is it the right URL?") from None
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise _Malformed(
                f"the management API refused user {user!r} (HTTP {exc.code}): it needs the management or "
                "monitoring tag, and access to the vhost"
            ) from None
        if exc.code == 404:
            raise _Malformed(f"the management API has no vhost {vhost!r} (HTTP 404)") from None
        raise _Malformed(f"the management API answered HTTP {exc.code}") from None
    except (OSError, urllib.error.URLError) as exc:  # refused, unresolvable, timed out, TLS
        raise _Malformed(f"the management API did not answer: {describe(exc)}") from None
    if not isinstance(answer, list):
        raise _Malformed("the management API's answer is not a list of queues: is it the right URL?")
    return [row for row in answer if isinstance(row, dict)]


async def check_shard_queues(management_url: str, settings: Settings) -> CheckResult:
    """Every shard's own queue on the worker's vhost, read through the management API: a ``FAIL`` naming each
    one that carries an ``x-dead-letter-*`` argument (its results and notices go on to wherever it points, a
    shard's work queue included: security review 5, N-E)."""
    amqp_url = split_urls(settings.rabbitmq_url)[0]
    vhost = vhost_of(amqp_url)
    base, user, password = _management_target(management_url, amqp_url)
    queues = await asyncio.to_thread(_list_queues, base, user, password, vhost)
    count, findings = shard_queue_findings(queues)
    target = redact(management_url)
    if findings:
        detail = (
            "; ".join(findings)
            + " (a shard's queues carry no dead-letter arguments, CONTRACT.md section 2: delete the queue "
            "and have the shard declare it again without them, and look at that shard's user)"
        )
        return CheckResult("shard queues", target, False, detail)
    return CheckResult(
        "shard queues",
        target,
        True,
        f"{count} shard queue(s) in vhost {vhost!r}, none with dead-letter arguments",
    )


#: the setting each dependency is reached through
_SETTINGS = {"postgres": "postgres_dsn", "rabbitmq": "rabbitmq_url", "redis": "redis_url"}


async def run_checks(settings: Settings, *, management_url: str | None = None) -> list[CheckResult]:
    """Every dependency, each with its own timeout; a failure becomes a result naming the error. With
    ``management_url`` (RabbitMQ's management API), the shards' own queues too (:func:`check_shard_queues`).

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
    if management_url is not None and "rabbitmq_url" not in malformed:
        checks.append(("shard queues", management_url, partial(check_shard_queues, management_url)))

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
    """A check that failed in words of its own, the detail as it is: a connection setting that can never
    work (the message names its variable), the management API's refusal."""


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
    skipped: tuple[tuple[str, str], ...] = (),
) -> str:
    """The report for a terminal: a line pair per dependency (``warn`` for a node that did not answer while
    another did), a ``skip`` line pair per check not made (``skipped``: what, why), a ``warn`` line per
    fallback and per note, the verdict."""
    verdict = judge(results, all_nodes=all_nodes)
    warned = {id(r) for r in verdict.warnings}
    lines = []
    for r in results:
        mark = "ok  " if r.ok else "warn" if id(r) in warned else "FAIL"
        lines.append(f"{mark}  {r.dependency:<9} {r.target}\n      {r.detail}")
    lines.extend(f"skip  {what}\n      {why}" for what, why in skipped)
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
    skipped: tuple[tuple[str, str], ...] = (),
) -> dict[str, Any]:
    """The report for a script (``worker check --json``); ``ok`` is the verdict the exit code gives,
    ``warnings`` the nodes that did not answer while another did (with ``--all-nodes`` they fail instead),
    ``fallbacks`` and ``notes`` the settings' warnings (never failures), ``skipped`` the checks not made
    (``check``, ``why``)."""
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
        "skipped": [{"check": what, "why": why} for what, why in skipped],
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
