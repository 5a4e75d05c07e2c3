"""The workers' keeper run by a test that fills the DLQ without a worker: the dead letters' copies it
published (they went to ``ltm.create_memory.dlq.copies`` as to the DLQ) kept in Postgres the way a running
worker keeps them (worker/runtime/keeper.py, the same code), so `worker dlq list` and `show` find them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import aio_pika
import aio_pika.exceptions

from tests.support.wait import eventually
from worker.config import Topology
from worker.runtime.keeper import Keeper
from worker.store.pool import create_pool

TOPOLOGY = Topology()


async def keep_copies(url: str, dsn: str, topology: Topology = TOPOLOGY) -> int:
    """Keep every copy waiting now; how many there were (0 also when the broker or the queue is not there:
    the tests of those cases run `worker dlq` against them)."""
    try:
        connection = await aio_pika.connect(url)
    except (OSError, aio_pika.exceptions.AMQPError):
        return 0
    pool = await create_pool(dsn, size=2)
    try:
        channel = await connection.channel()
        try:
            queue = await channel.declare_queue(topology.dead_letter_copies_queue, passive=True)
        except aio_pika.exceptions.ChannelNotFoundEntity:
            return 0
        waiting = int(queue.declaration_result.message_count or 0)
        if waiting == 0:
            return 0
        keeper = Keeper(await connection.channel(), pool, topology)
        await keeper.start()
        await eventually(lambda: keeper.kept >= waiting, f"the keeper keeps the {waiting} copies")
        await keeper.stop()
        return waiting
    finally:
        await connection.close()
        await pool.close()


@contextlib.asynccontextmanager
async def keeping(url: str, dsn: str, topology: Topology = TOPOLOGY) -> AsyncIterator[None]:
    """The copies waiting now kept before the block starts, and a keeper running through it for the letters
    dead-lettered meanwhile (as the workers of a deployment run theirs)."""
    await keep_copies(url, dsn, topology)
    connection = await aio_pika.connect(url)
    pool = await create_pool(dsn, size=2)
    keeper = Keeper(await connection.channel(), pool, topology)
    try:
        await keeper.start()
        yield
    finally:
        await keeper.stop()
        await connection.close()
        await pool.close()
