"""``worker shards``: who is loud, without Prometheus (docs/fair-shares.md).

Adds up what every worker recorded of every shard over the last minutes (``ltm_shard_activity``: events
in, answered, held now, the wait from publish to processing) and asks RabbitMQ how many events wait in each
shard's own queue and in the common one (passive declares: they create nothing and need no permission
beyond the vhost). One line per shard, loudest first, with its share of the events in and of the backlog.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aio_pika
import asyncpg

from worker.broker.topology import shard_queue_name
from worker.broker.urls import Nodes
from worker.config import Settings
from worker.observability.metrics import SHARD_WAIT_BUCKETS
from worker.observability.shards import OTHER_SHARD
from worker.redact import describe
from worker.store.activity import read_guild_activity, read_shard_activity
from worker.store.pool import connect_once
from worker.store.shard_queues import registered_shards

#: what the command says when a shard holds this share of the backlog (the alert's threshold too)
LOUD_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class GuildLine:
    """One of a shard's loudest guilds: events in and moved over the minutes, held by the workers now, and its
    share of its shard's events in."""

    guild: str
    received: int
    held: int
    moved: int
    share_in: float


@dataclass(frozen=True, slots=True)
class ShardLine:
    shard_id: int
    received: int
    answered: int
    held: int
    #: waiting in the shard's own queue (None: it has none, or RabbitMQ did not say)
    queued: int | None
    wait_p50_s: float | None
    wait_p99_s: float | None
    share_in: float
    share_backlog: float
    #: its loudest guilds (the workers' rows keep each shard's five loudest of every interval)
    guilds: list[GuildLine] = field(default_factory=list)

    @property
    def waiting(self) -> int:
        return self.held + (self.queued or 0)


@dataclass(frozen=True, slots=True)
class Report:
    minutes: float
    workers: int
    common_queued: int | None
    shards: list[ShardLine]
    problems: list[str]


def quantile(counts: Sequence[int], q: float, bounds: Sequence[float] = SHARD_WAIT_BUCKETS) -> float | None:
    """The upper bound of the bucket holding the ``q`` quantile (``inf`` past the last bound), or None."""
    total = sum(counts)
    if total == 0:
        return None
    rank, seen = q * total, 0
    for index, count in enumerate(counts):
        seen += count
        if seen >= rank:
            return bounds[index] if index < len(bounds) else float("inf")
    return float("inf")


async def gather(settings: Settings, minutes: float) -> Report:
    """The report: Postgres for the activity, RabbitMQ for the queues (either may be missing: a problem)."""
    problems: list[str] = []
    rows: list[dict[str, Any]] = []
    shards: list[int] = []
    guilds: dict[int, list[dict[str, Any]]] = {}
    try:
        conn = await connect_once(settings.postgres_dsn)
        try:
            rows = await read_shard_activity(conn, minutes)
            shards = await registered_shards(conn)
            guilds = await read_guild_activity(conn, minutes)
        finally:
            await conn.close()
    except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
        problems.append(f"postgres: {describe(exc)}")
    with_queues = sorted({*shards, *(r["shard_id"] for r in rows if r["shard_id"] != OTHER_SHARD)})
    depths, common = await _depths(settings, with_queues, problems)
    by_shard = {row["shard_id"]: row for row in rows}
    total_in = sum(int(row["received"]) for row in rows) or 0
    lines = []
    for shard_id in sorted(set(by_shard) | set(depths)):
        row = by_shard.get(shard_id, {})
        counts = [int(c) for c in (row.get("wait_counts") or [])]
        lines.append(
            ShardLine(
                shard_id=shard_id,
                received=int(row.get("received", 0)),
                answered=int(row.get("answered", 0)),
                held=int(row.get("held", 0)),
                queued=depths.get(shard_id),
                wait_p50_s=quantile(counts, 0.5),
                wait_p99_s=quantile(counts, 0.99),
                share_in=int(row.get("received", 0)) / total_in if total_in else 0.0,
                share_backlog=0.0,
                guilds=_guild_lines(guilds.get(shard_id, []), int(row.get("received", 0))),
            )
        )
    backlog = sum(line.waiting for line in lines)
    lines = [
        dataclasses.replace(line, share_backlog=line.waiting / backlog if backlog else 0.0) for line in lines
    ]
    lines.sort(key=lambda line: (-line.waiting, -line.received, line.shard_id))
    workers = max((int(row.get("workers", 0)) for row in rows), default=0)
    return Report(minutes, workers, common, lines, problems)


#: the guilds of a loud shard the report names
REPORTED_GUILDS = 3


def _guild_lines(rows: list[dict[str, Any]], shard_received: int) -> list[GuildLine]:
    return [
        GuildLine(
            guild=str(row["guild"]),
            received=int(row["received"]),
            held=int(row["held"]),
            moved=int(row["moved"]),
            share_in=int(row["received"]) / shard_received if shard_received else 0.0,
        )
        for row in rows[:REPORTED_GUILDS]
    ]


async def _depths(
    settings: Settings, shards: list[int], problems: list[str]
) -> tuple[dict[int, int], int | None]:
    depths: dict[int, int] = {}
    common: int | None = None
    try:
        connection = await Nodes.from_setting(settings.rabbitmq_url).connect()
    except Exception as exc:
        problems.append(f"rabbitmq: {describe(exc)}")
        return depths, common
    try:
        common = await queue_depth(connection, settings.topology.work_queue)
        for shard_id in shards:
            depth = await queue_depth(connection, shard_queue_name(settings.topology, shard_id))
            if depth is not None:
                depths[shard_id] = depth
    finally:
        await connection.close()
    return depths, common


async def queue_depth(connection: aio_pika.abc.AbstractConnection, name: str) -> int | None:
    channel = await connection.channel()
    try:
        queue = await channel.declare_queue(name, passive=True)
        return int(queue.declaration_result.message_count or 0)
    except aio_pika.exceptions.ChannelClosed:  # no such queue
        return None
    finally:
        if not channel.is_closed:
            await channel.close()


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value == float("inf"):
        return f"> {SHARD_WAIT_BUCKETS[-1]:g} s"
    return f"≤ {value:g} s"


def shard_name(shard_id: int) -> str:
    """A shard as the report names it: its number, or ``other`` for every shard without a queue of its own
    (counted together, so that junk shard ids cost no row each)."""
    return "other" if shard_id == OTHER_SHARD else str(shard_id)


def render(report: Report) -> str:
    common = "?" if report.common_queued is None else str(report.common_queued)
    lines = [
        f"shards over the last {report.minutes:g} min, from {report.workers} worker(s); "
        f"the common queue holds {common} event(s)"
    ]
    for problem in report.problems:
        lines.append(f"warning: {problem}")
    if not report.shards:
        lines.append("no shard sent anything in that time")
        return "\n".join(lines)
    header = (
        "shard",
        "in",
        "answered",
        "held",
        "queued",
        "wait p50",
        "wait p99",
        "share of in",
        "of backlog",
    )
    rows = [header] + [
        (
            shard_name(s.shard_id),
            str(s.received),
            str(s.answered),
            str(s.held),
            "-" if s.queued is None else str(s.queued),
            _seconds(s.wait_p50_s),
            _seconds(s.wait_p99_s),
            f"{s.share_in:.0%}",
            f"{s.share_backlog:.0%}",
        )
        for s in report.shards
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    loud = [s for s in report.shards if s.share_backlog >= LOUD_SHARE and s.waiting >= 100]
    for s in loud:
        lines.append(
            f"shard {shard_name(s.shard_id)} holds {s.share_backlog:.0%} of the backlog "
            f"({s.waiting} events): it waits in its own queue, the others are served beside it "
            '(docs/operating.md, "A loud shard")'
        )
        for g in s.guilds:
            lines.append(
                f"  guild {g.guild}: in {g.received} ({g.share_in:.0%} of the shard's), held {g.held}, "
                f"moved {g.moved}"
            )
    return "\n".join(lines)


def as_json(report: Report) -> str:
    def number(value: float | None) -> float | str | None:
        return "inf" if value == float("inf") else value

    return json.dumps(
        {
            "minutes": report.minutes,
            "workers": report.workers,
            "common_queued": report.common_queued,
            "problems": report.problems,
            "shards": [
                {**asdict(s), "wait_p50_s": number(s.wait_p50_s), "wait_p99_s": number(s.wait_p99_s)}
                for s in report.shards
            ],
        }
    )


def run_shards(settings: Settings, *, minutes: float, json_output: bool) -> int:
    """``worker shards``: 0 with a report, 1 when neither Postgres nor RabbitMQ answered."""
    report = asyncio.run(gather(settings, minutes))
    print(as_json(report) if json_output else render(report))
    return 1 if len(report.problems) == 2 else 0
