"""The shards that have a queue of their own (``ltm_shard_queues``, migration 0009): a claim under the cap
(one at a time, so racing workers never pass it together), the list, and the forgetting of a gone shard."""

from __future__ import annotations

import asyncpg

#: the advisory lock (two-key space: it never meets the pipeline's one-key locks) under which one claim at a
#: time counts the rows of ltm_shard_queues
_SHARD_QUEUE_CLAIM_LOCK = (0x4C544D51, 1)  # "LTMQ"


async def register_shard(conn: asyncpg.Connection | asyncpg.Pool, shard_id: int) -> None:
    """Record that shard ``shard_id`` has a queue of its own, whatever the cap (tests and tools)."""
    await conn.execute(
        "INSERT INTO ltm_shard_queues (shard_id) VALUES ($1) ON CONFLICT (shard_id) DO NOTHING", shard_id
    )


async def claim_shard_queue(pool: asyncpg.Pool | asyncpg.Connection, shard_id: int, limit: int) -> bool:
    """A row of ``ltm_shard_queues`` for shard ``shard_id``: True when it has one (now or already), False
    when the rows are at ``limit``. Claims are counted one at a time (an advisory lock), so workers racing on
    different shards never pass the cap together."""
    if isinstance(pool, asyncpg.Pool):
        async with pool.acquire() as conn:
            return await claim_shard_queue(conn, shard_id, limit)
    conn = pool
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", *_SHARD_QUEUE_CLAIM_LOCK)
        return bool(
            await conn.fetchval(
                "WITH added AS ("
                " INSERT INTO ltm_shard_queues (shard_id)"
                " SELECT $1 WHERE (SELECT count(*) FROM ltm_shard_queues) < $2"
                " ON CONFLICT (shard_id) DO NOTHING RETURNING shard_id)"
                " SELECT EXISTS (SELECT 1 FROM added)"
                " OR EXISTS (SELECT 1 FROM ltm_shard_queues WHERE shard_id = $1)",
                shard_id,
                limit,
            )
        )


async def forget_shard_queue(conn: asyncpg.Connection | asyncpg.Pool, shard_id: int) -> bool:
    """Delete shard ``shard_id``'s row (its queue is no longer consumed by workers that start or refresh);
    True when there was one."""
    return bool(await conn.fetchval("DELETE FROM ltm_shard_queues WHERE shard_id = $1 RETURNING 1", shard_id))


async def registered_shards(conn: asyncpg.Connection | asyncpg.Pool) -> list[int]:
    """Every shard with a queue of its own, in order."""
    rows = await conn.fetch("SELECT shard_id FROM ltm_shard_queues ORDER BY shard_id")
    return [row["shard_id"] for row in rows]
