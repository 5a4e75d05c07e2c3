"""Each shard's own queue, ``ltm.create_memory.shard.<N>``, on one connection (docs/fair-shares.md).

A worker declares a shard's queue the first time it sees the shard (an event on the common work queue),
binds it with the shard's own routing keys (``tool.<name>.shard.<N>``, which the kit publishes with), records
it in Postgres (``ltm_shard_queues``) and consumes it. Every worker reads that record every few seconds and
consumes every queue in it, so a shard's queue is drained by the others when the worker that filled it
dies. Declares run on a channel of their own: a refused declare (a queue re-declared with other arguments)
closes that channel only, and the shard's events stay on the common path.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import structlog
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

from worker.broker.topology import declare_shard_queue, shard_queue_name
from worker.config import Topology
from worker.redact import describe
from worker.store.repository import register_shard, registered_shards

log = structlog.get_logger("worker")

#: how often a worker looks for queues other workers declared
REFRESH_SECONDS = 5.0


class ShardQueues:
    """The shards' own queues this connection consumes; at most ``limit`` of them."""

    def __init__(
        self,
        *,
        connection: AbstractConnection,
        consume_channel: AbstractChannel,
        topology: Topology,
        pool: asyncpg.Pool,
        on_message: Callable[[AbstractIncomingMessage], Awaitable[Any]],
        limit: int,
        refresh_seconds: float = REFRESH_SECONDS,
    ) -> None:
        self._connection = connection
        self._consume = consume_channel
        self._declare: AbstractChannel | None = None
        self._topology = topology
        self._pool = pool
        self._on_message = on_message
        self._limit = limit
        self._refresh_seconds = refresh_seconds
        #: consumer tag of each shard's queue consumed here
        self._tags: dict[int, str] = {}
        self._starting: dict[int, asyncio.Future[bool]] = {}
        #: shards whose queue exists but whose record in Postgres failed (tried again on each refresh)
        self._unrecorded: set[int] = set()
        self._warned_full = False
        #: while set, no shard queue is consumed (the worker holds its byte budget: Consumer)
        self.paused = False

    @property
    def consumed(self) -> int:
        return len(self._tags)

    def has(self, shard_id: int) -> bool:
        """True once shard ``shard_id``'s queue is declared and consumed here."""
        return shard_id in self._tags

    def queue_of(self, shard_id: int) -> str:
        return shard_queue_name(self._topology, shard_id)

    async def ensure(self, shard_id: int) -> bool:
        """Declare, record and consume shard ``shard_id``'s queue unless this connection already does;
        False when it cannot (over the limit, a refused declare, a lost channel): its events stay on the
        common path."""
        if shard_id in self._tags:
            return True
        if self.paused:
            return False
        starting = self._starting.get(shard_id)
        if starting is not None:
            return await asyncio.shield(starting)
        if len(self._tags) + len(self._starting) >= self._limit:
            if not self._warned_full:
                self._warned_full = True
                log.warning(
                    "shard queue limit reached; further shards share the common queue",
                    limit=self._limit,
                    setting="LTM_SHARD_QUEUES_MAX",
                )
            return False
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._starting[shard_id] = future
        try:
            ok = await self._start(shard_id)
        except BaseException:
            future.set_result(False)
            raise
        else:
            future.set_result(ok)
        finally:
            del self._starting[shard_id]
        return ok

    def cancelled(self, consumer_tag: str | None) -> None:
        """The broker cancelled one of these consumers (its queue was deleted): forget it; the next refresh
        declares it again if the shard is still recorded."""
        for shard_id, tag in list(self._tags.items()):
            if tag == consumer_tag:
                del self._tags[shard_id]
                log.warning("a shard queue's consumer was cancelled by the broker", shard_id=shard_id)

    async def follow(self) -> None:
        """Consume every queue any worker recorded, now and every few seconds, until cancelled."""
        while True:
            try:
                for shard_id in await registered_shards(self._pool):
                    await self.ensure(shard_id)
                for shard_id in list(self._unrecorded):
                    await register_shard(self._pool, shard_id)
                    self._unrecorded.discard(shard_id)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Postgres away: the queues consumed so far stay consumed
                log.warning("could not read the shard queues' record", error=describe(exc))
            await asyncio.sleep(self._refresh_seconds)

    async def pause(self) -> None:
        """Stop consuming every shard's queue until :meth:`resume`; what was delivered stays to settle."""
        self.paused = True
        await self.cancel_all()

    async def resume(self) -> None:
        """Consume every recorded shard's queue again."""
        self.paused = False
        for shard_id in await registered_shards(self._pool):
            await self.ensure(shard_id)

    async def cancel_all(self) -> None:
        """Stop consuming every shard's queue (a graceful stop): what was delivered stays to be settled."""
        for shard_id, tag in list(self._tags.items()):
            with contextlib.suppress(Exception):
                queue = await self._consume.get_queue(self.queue_of(shard_id), ensure=False)
                await queue.cancel(tag)
        self._tags.clear()

    async def _start(self, shard_id: int) -> bool:
        try:
            declare = await self._declare_channel()
            await declare_shard_queue(declare, self._topology, shard_id)
            queue = await self._consume.get_queue(self.queue_of(shard_id), ensure=False)
            self._tags[shard_id] = await queue.consume(self._on_message, no_ack=False)
        except Exception as exc:
            log.error(
                "could not declare or consume a shard's own queue; its events stay on the common queue",
                shard_id=shard_id,
                queue=self.queue_of(shard_id),
                error=describe(exc),
            )
            return False
        try:
            await register_shard(self._pool, shard_id)
        except Exception as exc:
            self._unrecorded.add(shard_id)
            log.warning(
                "could not record a shard's queue; tried again later", shard_id=shard_id, error=describe(exc)
            )
        return True

    async def _declare_channel(self) -> AbstractChannel:
        if self._declare is None or self._declare.is_closed:
            self._declare = await self._connection.channel(publisher_confirms=False)
        return self._declare
