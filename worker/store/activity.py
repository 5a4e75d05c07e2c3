"""What each worker saw of each shard and of its loudest guilds, per interval (``ltm_shard_activity``,
migrations 0009 and 0010): written by every worker, added up by ``worker shards``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg


@dataclass(frozen=True, slots=True)
class GuildActivity:
    """What one worker saw of one guild of a shard in one interval (``ltm_shard_activity.guilds``)."""

    guild: str
    received: int
    held: int
    moved: int


@dataclass(frozen=True, slots=True)
class ActivityRow:
    """What one worker saw of one shard in one interval (``ltm_shard_activity``)."""

    shard_id: int
    received: int
    answered: int
    held: int
    #: events per wait bucket (the last one: longer than the last bound)
    wait_counts: list[int]
    #: the shard's loudest guilds (migration 0010)
    guilds: list[GuildActivity] = field(default_factory=list)


#: how long ``ltm_shard_activity`` keeps a row
ACTIVITY_KEPT = "1 hour"


async def write_shard_activity(
    conn: asyncpg.Connection | asyncpg.Pool, worker: str, rows: Sequence[ActivityRow]
) -> None:
    """One row per shard of ``rows``, stamped now, for ``worker`` (on a connection of the worker's pool, whose
    ``jsonb`` codec encodes the list)."""
    await conn.execute(
        "INSERT INTO ltm_shard_activity"
        " (sampled_at, worker, shard_id, received, answered, held, wait_counts, guilds)"
        " SELECT now(), $1, r.shard_id, r.received, r.answered, r.held,"
        " ARRAY(SELECT jsonb_array_elements_text(r.wait_counts)::integer), r.guilds"
        " FROM jsonb_to_recordset($2::jsonb) AS r(shard_id integer, received integer, answered integer,"
        " held integer, wait_counts jsonb, guilds jsonb)",
        worker,
        [
            {
                "shard_id": row.shard_id,
                "received": row.received,
                "answered": row.answered,
                "held": row.held,
                "wait_counts": row.wait_counts,
                "guilds": [
                    {"guild": g.guild, "received": g.received, "held": g.held, "moved": g.moved}
                    for g in row.guilds
                ],
            }
            for row in rows
        ],
    )


async def read_guild_activity(conn: asyncpg.Connection, minutes: float) -> dict[int, list[dict[str, Any]]]:
    """Per shard, its guilds named in the rows of the last ``minutes`` (each row keeps its shard's loudest),
    loudest first: events in and moved, summed; held now, each worker's latest row of the last minute."""
    rows = await conn.fetch(
        """
        WITH recent AS (
            SELECT * FROM ltm_shard_activity WHERE sampled_at >= now() - make_interval(secs => $1)
        ), latest AS (
            SELECT worker, max(sampled_at) AS sampled_at FROM recent GROUP BY worker
        )
        SELECT r.shard_id, g.guild,
               sum(g.received)::bigint AS received,
               sum(g.moved)::bigint AS moved,
               coalesce(sum(g.held) FILTER (
                   WHERE l.worker IS NOT NULL AND r.sampled_at > now() - interval '1 minute'
               ), 0)::bigint AS held
        FROM recent r
        CROSS JOIN LATERAL jsonb_to_recordset(r.guilds) AS g(guild text, received integer, held integer,
                                                             moved integer)
        LEFT JOIN latest l ON l.worker = r.worker AND l.sampled_at = r.sampled_at
        WHERE r.guilds IS NOT NULL
        GROUP BY r.shard_id, g.guild
        ORDER BY r.shard_id, held DESC, received DESC, moved DESC, g.guild
        """,
        minutes * 60,
    )
    guilds: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        guilds.setdefault(row["shard_id"], []).append(dict(row))
    return guilds


async def forget_shard_activity(conn: asyncpg.Connection | asyncpg.Pool) -> None:
    """Remove the rows older than :data:`ACTIVITY_KEPT`."""
    await conn.execute(
        f"DELETE FROM ltm_shard_activity WHERE sampled_at < now() - interval '{ACTIVITY_KEPT}'"
    )


async def read_shard_activity(conn: asyncpg.Connection, minutes: float) -> list[dict[str, Any]]:
    """Per shard over the last ``minutes``: events received and answered, the wait counts per bucket summed
    over every worker, the events held now (each worker's latest row of the last minute, summed), how many
    workers reported, and the age of the shard's newest row in seconds (``age_s``)."""
    return [
        dict(row)
        for row in await conn.fetch(
            """
            WITH recent AS (
                SELECT * FROM ltm_shard_activity WHERE sampled_at >= now() - make_interval(secs => $1)
            ), latest AS (
                SELECT worker, max(sampled_at) AS sampled_at FROM recent GROUP BY worker
            )
            SELECT r.shard_id,
                   sum(r.received)::bigint AS received,
                   sum(r.answered)::bigint AS answered,
                   coalesce(sum(r.held) FILTER (
                       WHERE l.worker IS NOT NULL AND r.sampled_at > now() - interval '1 minute'
                   ), 0)::bigint AS held,
                   (SELECT array_agg(total ORDER BY n) FROM (
                        SELECT n, sum(c)::bigint AS total
                        FROM recent x, unnest(x.wait_counts) WITH ORDINALITY AS u(c, n)
                        WHERE x.shard_id = r.shard_id GROUP BY n) AS w) AS wait_counts,
                   count(DISTINCT r.worker) AS workers,
                   extract(epoch FROM now() - max(r.sampled_at))::float8 AS age_s
            FROM recent r
            LEFT JOIN latest l ON l.worker = r.worker AND l.sampled_at = r.sampled_at
            GROUP BY r.shard_id
            ORDER BY r.shard_id
            """,
            minutes * 60,
        )
    ]
