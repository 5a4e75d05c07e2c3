"""Each shard's own queue, ``ltm.create_memory.shard.<N>``, on one connection (docs/fair-shares.md).

A shard earns a queue with an event that passed the schema and the identity rule
(:class:`~worker.runtime.fair.FairShares` asks, on the shard's first sight): the worker first claims the
shard a row of ``ltm_shard_queues`` in Postgres, under the cap ``LTM_SHARD_QUEUES_MAX`` counted over every
worker's rows (one claim at a time, under an advisory lock), then declares the queue, binds it with the
shard's own routing keys (``tool.<name>.shard.<N>``, which the kit publishes with) and consumes it. Every
worker reads the rows every few seconds and consumes every queue in them, so a shard's queue is drained by
the others when the worker that filled it dies. Rows first, both ways: no queue without its row (a claim
refused at the cap declares nothing), and ``worker shards --forget`` deletes the row before the queue, or the
workers would declare it again. Declares run on a channel of their own: a refused declare (a queue
re-declared with other arguments) closes that channel only, and the shard's events stay on the common path.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import asyncpg
import structlog
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

from worker.broker.topology import declare_shard_queue, shard_queue_name
from worker.config import Topology
from worker.redact import describe
from worker.store.shard_queues import claim_shard_queue, registered_shards

log = structlog.get_logger("worker")

#: how often a worker looks for queues other workers declared
REFRESH_SECONDS = 5.0


class OnRecorded(Protocol):
    """Told the shards with a row and whether the rows are under the cap (the metrics' labels follow)."""

    def __call__(self, shard_ids: Iterable[int], *, under_cap: bool) -> None: ...


def _ignore(shard_ids: Iterable[int], *, under_cap: bool) -> None:
    pass


class ShardQueues:
    """The shards' own queues this connection consumes: every recorded one (at most ``limit`` rows, over every
    worker)."""

    def __init__(
        self,
        *,
        connection: AbstractConnection,
        consume_channel: AbstractChannel,
        topology: Topology,
        pool: asyncpg.Pool,
        on_message: Callable[[AbstractIncomingMessage], Awaitable[Any]],
        limit: int,
        spawn: Callable[[Awaitable[Any]], object],
        on_recorded: OnRecorded | None = None,
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
        #: shards asked for and refused (the cap, a failed declare) since the last refresh: not asked again
        #: for every event until then
        self._refused: set[int] = set()
        #: the shards with a row, as last read or claimed here
        self._recorded: frozenset[int] = frozenset()
        self._spawn = spawn
        #: told the shards with a row, and whether they are under the cap, after every read of the rows and
        #: every claim (the metrics' labels follow them)
        self._on_recorded: OnRecorded = on_recorded or _ignore
        self._warned_full = False
        #: the rows were at the cap when last read or claimed: no shard is asked for until a refresh
        self._at_cap = False
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

    def ask(self, shard_id: int) -> None:
        """Shard ``shard_id`` was seen, with an event that passed the checks, and has no queue here: claim,
        declare and consume one in the background, unless that is under way or was refused lately."""
        if shard_id in self._tags or shard_id in self._starting or shard_id in self._refused or self.paused:
            return
        if self._at_cap:  # until a refresh shows room: no claim (a query) per new shard id an event names
            return
        self._spawn(self.ensure(shard_id, claim=True))

    async def ensure(self, shard_id: int, *, claim: bool = False) -> bool:
        """Consume shard ``shard_id``'s queue unless this connection already does, declaring it first;
        ``claim``: the shard may have no row yet, so claim it one under the cap first. False when it cannot
        (the cap, a refused declare, a lost channel): its events stay on the common path."""
        if shard_id in self._tags:
            return True
        if self.paused:
            return False
        starting = self._starting.get(shard_id)
        if starting is not None:
            return await asyncio.shield(starting)
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._starting[shard_id] = future
        try:
            ok = await self._start(shard_id, claim=claim)
            if not ok:
                self._refused.add(shard_id)
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
                await self._consume_recorded()
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
        await self._consume_recorded()

    async def cancel_all(self) -> None:
        """Stop consuming every shard's queue (a graceful stop): what was delivered stays to be settled."""
        for shard_id, tag in list(self._tags.items()):
            with contextlib.suppress(Exception):
                queue = await self._consume.get_queue(self.queue_of(shard_id), ensure=False)
                await queue.cancel(tag)
        self._tags.clear()

    async def _consume_recorded(self) -> None:
        recorded = await registered_shards(self._pool)
        self._refused.clear()
        self._recorded = frozenset(recorded)
        self._at_cap = len(self._recorded) >= self._limit
        self._on_recorded(self._recorded, under_cap=len(self._recorded) < self._limit)
        for shard_id in recorded:
            await self.ensure(shard_id)

    async def _claim(self, shard_id: int) -> bool:
        """A row for shard ``shard_id`` (it may have one already), unless the rows are at the cap."""
        try:
            claimed = await claim_shard_queue(self._pool, shard_id, self._limit)
        except Exception as exc:
            log.warning(
                "could not claim a shard's queue in Postgres; its events stay on the common queue",
                shard_id=shard_id,
                error=describe(exc),
            )
            return False
        if not claimed and not self._warned_full:
            self._warned_full = True
            log.warning(
                "shard queue cap reached (rows of ltm_shard_queues, all workers); further shards share the "
                "common queue",
                limit=self._limit,
                setting="LTM_SHARD_QUEUES_MAX",
            )
        if claimed:
            self._recorded |= {shard_id}
        else:
            self._at_cap = True
        self._on_recorded(self._recorded, under_cap=claimed and len(self._recorded) < self._limit)
        return claimed

    async def _start(self, shard_id: int, *, claim: bool) -> bool:
        if claim and not await self._claim(shard_id):
            return False
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
        return True

    async def _declare_channel(self) -> AbstractChannel:
        if self._declare is None or self._declare.is_closed:
            self._declare = await self._connection.channel(publisher_confirms=False)
        return self._declare
