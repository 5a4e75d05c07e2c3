"""``worker shards``: who is loud, without Prometheus (docs/fair-shares.md).

Adds up what every worker recorded of every shard over the last minutes (``ltm_shard_activity``: events
in, answered, held now, the wait from publish to processing) and asks RabbitMQ how many events wait in each
shard's own queue and in the common one (passive declares: they create nothing and need no permission
beyond the vhost). One line per shard, loudest first, with its share of the events in and of the backlog.

The counts and the depths are of different moments: the workers write their counts every
``LTM_METRICS_INTERVAL_SECONDS``, RabbitMQ answers now, and the header says how old the counts are. A
shard with nothing in the window (no event in, none answered, none held or queued) is folded into one
line unless asked for (``--all``). The verdict under a loud shard says where its backlog is, from its own
columns: held by the workers, waiting in its own queue, or both.
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
from worker.observability.activity import OTHER_SHARD
from worker.observability.metrics import SHARD_WAIT_BUCKETS
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
    #: the upper bounds of the wait's buckets holding its p50 and p99 (``inf``: past the last bound)
    wait_p50_le_s: float | None
    wait_p99_le_s: float | None
    share_in: float
    share_backlog: float
    #: its loudest guilds (the workers' rows keep each shard's five loudest of every interval)
    guilds: list[GuildLine] = field(default_factory=list)

    @property
    def waiting(self) -> int:
        return self.held + (self.queued or 0)

    @property
    def quiet(self) -> bool:
        """Nothing of it in the window: no event in, none answered, none held, none in its own queue."""
        return not (self.received or self.answered or self.held or self.queued)


@dataclass(frozen=True, slots=True)
class Report:
    minutes: float
    workers: int
    common_queued: int | None
    shards: list[ShardLine]
    problems: list[str]
    #: seconds since the newest count any worker wrote (None: no count in the window)
    counts_age_s: float | None = None
    #: LTM_METRICS_INTERVAL_SECONDS as this process reads it: how often each worker writes its counts
    interval_s: float | None = None


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
                wait_p50_le_s=quantile(counts, 0.5),
                wait_p99_le_s=quantile(counts, 0.99),
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
    age = min((float(row["age_s"]) for row in rows if row.get("age_s") is not None), default=None)
    return Report(minutes, workers, common, lines, problems, age, settings.metrics_interval_seconds)


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


#: where the verdict sends the person who reads it (a section of docs/operating.md)
WHAT_TO_DO = 'docs/operating.md, "A loud shard: what to do"'


def header(report: Report) -> list[str]:
    """The report's first lines: the window and the workers, then how old the counts are against the live
    queue depths."""
    common = "?" if report.common_queued is None else str(report.common_queued)
    every = "" if report.interval_s is None else f": {report.interval_s:g} s here"
    if any(problem.startswith("postgres:") for problem in report.problems):
        counts = "no counts: Postgres could not be read (the warning below)"
    elif report.counts_age_s is None:
        counts = f"no counts in that time (the workers write them every LTM_METRICS_INTERVAL_SECONDS{every})"
    else:
        counts = (
            f"counts as of {report.counts_age_s:.0f} s ago (the workers write them every "
            f"LTM_METRICS_INTERVAL_SECONDS{every})"
        )
    return [
        f"shards over the last {report.minutes:g} min, from {report.workers} worker(s); the common queue "
        f"holds {common} event(s) now",
        f"{counts}; queue depths now",
    ]


def is_loud(line: ShardLine) -> bool:
    """Half the backlog or more, and 100 events or more (the alert's share, on a smaller backlog)."""
    return line.share_backlog >= LOUD_SHARE and line.waiting >= 100


def verdict(line: ShardLine) -> str:
    """What the report says of a loud shard, from its own columns: where its backlog is."""
    held, queued = line.held, line.queued or 0
    if held and queued:
        where = f"{held} held by the workers and {queued} waiting in its own queue"
    elif queued:
        where = f"all {queued} waiting in its own queue, none held by the workers"
    elif line.queued is None:
        where = f"all {held} held by the workers (it has no queue of its own, or RabbitMQ did not say)"
    else:
        where = f"all {held} held by the workers, its own queue empty"
    return (
        f"shard {shard_name(line.shard_id)} holds {line.share_backlog:.0%} of the backlog "
        f"({line.waiting} events): {where}; the other shards are served beside it. What to do: {WHAT_TO_DO}"
    )


def shown(report: Report, *, show_quiet: bool) -> tuple[list[ShardLine], int]:
    """The shards the report lists, and how many quiet ones it leaves out (none with ``show_quiet``)."""
    if show_quiet:
        return list(report.shards), 0
    listed = [line for line in report.shards if not line.quiet]
    return listed, len(report.shards) - len(listed)


def render(report: Report, *, show_quiet: bool = False) -> str:
    lines = header(report)
    for problem in report.problems:
        lines.append(f"warning: {problem}")
    listed, folded = shown(report, show_quiet=show_quiet)
    if not listed:
        lines.append("no shard sent anything in that time")
    else:
        lines += _table(listed)
    if folded:
        lines.append(
            f"{folded} quiet shard(s) not shown: nothing in, answered, held or queued (--all lists them)"
        )
    for s in listed:
        if not is_loud(s):
            continue
        lines.append(verdict(s))
        for g in s.guilds:
            lines.append(
                f"  guild {g.guild}: in {g.received} ({g.share_in:.0%} of the shard's), held {g.held}, "
                f"moved {g.moved}"
            )
    return "\n".join(lines)


def _table(listed: list[ShardLine]) -> list[str]:
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
            _seconds(s.wait_p50_le_s),
            _seconds(s.wait_p99_le_s),
            f"{s.share_in:.0%}",
            f"{s.share_backlog:.0%}",
        )
        for s in listed
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def as_json(report: Report, *, show_quiet: bool = False) -> str:
    """One object: the header's facts, the shards listed (as the table) and how many quiet ones were left
    out; the waits as the upper bounds of their buckets (``wait_p50_le_s``: the p50 is at most that)."""

    def number(value: float | None) -> float | str | None:
        return "inf" if value == float("inf") else value

    listed, folded = shown(report, show_quiet=show_quiet)
    return json.dumps(
        {
            "minutes": report.minutes,
            "workers": report.workers,
            "counts_age_s": report.counts_age_s,
            "counts_interval_s": report.interval_s,
            "common_queued": report.common_queued,
            "problems": report.problems,
            "shards": [
                {
                    **asdict(s),
                    "wait_p50_le_s": number(s.wait_p50_le_s),
                    "wait_p99_le_s": number(s.wait_p99_le_s),
                    "loud": is_loud(s),
                }
                for s in listed
            ],
            "quiet_shards_not_shown": folded,
        }
    )


def run_shards(settings: Settings, *, minutes: float, json_output: bool, show_quiet: bool = False) -> int:
    """``worker shards``: 0 with a report, 1 when neither Postgres nor RabbitMQ answered."""
    report = asyncio.run(gather(settings, minutes))
    print(as_json(report, show_quiet=show_quiet) if json_output else render(report, show_quiet=show_quiet))
    return 1 if len(report.problems) == 2 else 0
