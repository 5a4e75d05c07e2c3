"""The workers' keeper run without a worker, for a test or a bench that fills the DLQ itself: the dead
letters' copies (they went to ``ltm.create_memory.dlq.copies`` as to the DLQ) kept in Postgres the way a
running worker keeps them (worker/runtime/keeper.py, the same code), so ``worker dlq list`` and ``show`` find
them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aio_pika
import aio_pika.exceptions

from worker.config import Topology
from worker.runtime.keeper import Keeper
from worker.store.pool import create_pool

TOPOLOGY = Topology()


async def keep_copies(url: str, dsn: str, topology: Topology = TOPOLOGY, *, timeout: float = 120.0) -> int:
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
        deadline = asyncio.get_running_loop().time() + timeout
        while keeper.kept < waiting:
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"the keeper kept {keeper.kept} of {waiting} copies in {timeout:g} s")
            await asyncio.sleep(0.02)
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
