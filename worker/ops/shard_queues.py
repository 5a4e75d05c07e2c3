"""The shards' own queues by hand: ``worker shards --declare N ...`` gives shards their queue ahead of their
first event, ``worker shards --forget N ...`` removes the queues of shards that are gone (after resharding),
in the order that works while workers run.

**Declared ahead.** A shard on the kit publishes with its own routing key once its queue exists, and its first
events otherwise go through the common queue (the kit falls back to the version-1 key and tries its own again
30 s later), where a flood published before them is ahead of them. Declaring the deployment's shards ahead
(the row first, under ``LTM_SHARD_QUEUES_MAX``, then the queue and its bindings) takes the common queue out of
their path from the first event; every worker consumes the queue within its refresh (5 s).

**Forgotten.**
Every worker consumes every queue recorded in ``ltm_shard_queues`` and declares it again when it is missing
(its refresh, every 5 s), so a queue deleted first comes back. The row goes first: then no worker that starts
or refreshes consumes the queue; then the queue is deleted, which also cancels the consumers of the workers
still on it. Only a shard that is gone: a shard any worker saw an event of within ``--quiet-minutes`` (10,
from ``ltm_shard_activity``), or whose queue still holds events, is left as it is, row and all (the workers
drain it while it has its row). Quorum queues take no ``if-empty`` on a delete, so the queue is checked
empty after its row is gone, just before the delete.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aio_pika
import aio_pika.exceptions
import asyncpg

from worker.broker.topology import declare_shard_queue, shard_queue_name
from worker.broker.urls import Nodes
from worker.config import Settings
from worker.ops.shards_report import queue_depth
from worker.redact import describe
from worker.store.activity import read_shard_activity
from worker.store.pool import connect_once
from worker.store.shard_queues import claim_shard_queue, forget_shard_queue, register_shard


@dataclass(frozen=True, slots=True)
class Forgotten:
    """What became of one shard's queue."""

    shard_id: int
    #: done (forgotten: row and queue, or what there was of them, removed; declared: row and queue there), or
    #: left as it was (why in ``detail``)
    removed: bool
    detail: str


#: a shard any worker saw an event of this recently is not gone
QUIET_MINUTES = 10.0


async def forget_shards(
    settings: Settings, shard_ids: list[int], *, quiet_minutes: float = QUIET_MINUTES
) -> list[Forgotten]:
    """Each quiet shard's row, then its queue if it is empty; what became of each."""
    conn = await connect_once(settings.postgres_dsn)
    connection = await Nodes.from_setting(settings.rabbitmq_url).connect()
    try:
        activity = await read_shard_activity(conn, quiet_minutes)
        heard = {row["shard_id"] for row in activity if row["received"]}
        return [
            await _forget(settings, conn, connection, shard_id)
            if shard_id not in heard
            else Forgotten(shard_id, False, f"events of it came in the last {quiet_minutes:g} min: not gone")
            for shard_id in shard_ids
        ]
    finally:
        await connection.close()
        await conn.close()


async def _forget(
    settings: Settings, conn: asyncpg.Connection, connection: aio_pika.abc.AbstractConnection, shard_id: int
) -> Forgotten:
    name = shard_queue_name(settings.topology, shard_id)
    depth = await queue_depth(connection, name)
    if depth:
        return Forgotten(shard_id, False, f"{name} holds {depth} event(s): left with its row")
    had_row = await forget_shard_queue(conn, shard_id)
    if depth is None:
        row = "row removed" if had_row else "no row either"
        return Forgotten(shard_id, True, f"no queue {name}; {row}")
    depth = await queue_depth(connection, name)
    if depth:  # an event came in meanwhile: the shard is not gone
        if had_row:
            await register_shard(conn, shard_id)
        return Forgotten(shard_id, False, f"{name} took {depth} event(s) meanwhile: left, its row back")
    channel = await connection.channel()
    try:
        await channel.queue_delete(name, if_unused=False, if_empty=False)
    except aio_pika.exceptions.ChannelClosed as exc:
        return Forgotten(shard_id, False, f"row removed; {name} was not deleted: {describe(exc)}")
    finally:
        if not channel.is_closed:
            await channel.close()
    return Forgotten(shard_id, True, f"row removed, then {name} (empty) deleted")


async def declare_shards(settings: Settings, shard_ids: list[int]) -> list[Forgotten]:
    """Each shard's row (under the cap), then its queue and bindings; what became of each (``removed``
    meaning done)."""
    conn = await connect_once(settings.postgres_dsn)
    connection = await Nodes.from_setting(settings.rabbitmq_url).connect()
    done: list[Forgotten] = []
    try:
        for shard_id in shard_ids:
            name = shard_queue_name(settings.topology, shard_id)
            if not await claim_shard_queue(conn, shard_id, settings.shard_queues_max):
                cap = settings.shard_queues_max
                done.append(
                    Forgotten(shard_id, False, f"not declared: the {cap} shard queues of the cap are taken")
                )
                continue
            channel = await connection.channel()
            try:
                await declare_shard_queue(channel, settings.topology, shard_id)
            except aio_pika.exceptions.ChannelClosed as exc:
                done.append(Forgotten(shard_id, False, f"row kept, {name} not declared: {describe(exc)}"))
                continue
            finally:
                if not channel.is_closed:
                    await channel.close()
            done.append(Forgotten(shard_id, True, f"{name} declared and bound; the workers consume it"))
    finally:
        await connection.close()
        await conn.close()
    return done


def run_declare(settings: Settings, shard_ids: list[int]) -> int:
    """0 when every shard has its queue, 1 when any has not (a line says why)."""
    return _report(asyncio.run(declare_shards(settings, shard_ids)), "declared")


def run_forget(settings: Settings, shard_ids: list[int], *, quiet_minutes: float = QUIET_MINUTES) -> int:
    """0 when every shard's queue and row are gone, 1 when any was left (a line says why)."""
    return _report(asyncio.run(forget_shards(settings, shard_ids, quiet_minutes=quiet_minutes)), "removed")


def _report(results: list[Forgotten], verb: str) -> int:
    for result in results:
        print(f"shard {result.shard_id}: {verb if result.removed else 'left'}: {result.detail}")
    return 0 if all(result.removed for result in results) else 1
