"""One connection's life: channels, topology, consume the common work queue and every shard's own queue,
carry out what fair shares decide for each delivery, then drain on a stop or abandon what is in flight when
the connection is lost (the broker redelivers it, the ledger answers it).

What happens to a delivery (served in its tenant's turn, moved to its shard's queue, handed back) is
decided by :class:`~worker.runtime.fair.FairShares`, in the order docs/fair-shares.md explains; this module
only carries it out over AMQP. It also keeps the common queue's window to what the byte budget allows
(:meth:`FairShares.window`), and past ``LTM_HELD_BYTES_MAX`` stops consuming every queue, the common one and
the shards' own, until half of it is processed or moved.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import structlog
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage, AbstractQueue

from worker.aio import close_quietly, first_of
from worker.broker.acks import Acks
from worker.broker.blocking import BrokerBlock
from worker.broker.blocking import watch as watch_blocks
from worker.broker.publisher import BacklogFull, Publisher
from worker.broker.topology import declare_topology, work_queue_arguments
from worker.redact import describe, redact_url
from worker.runtime.fair import Action, FairShares, Guild, Ticket
from worker.runtime.handler import EventHandler
from worker.runtime.keeper import Keeper
from worker.runtime.services import Services
from worker.runtime.shard_queue_set import ShardQueues
from worker.service.identity import IdentityRule

log = structlog.get_logger("worker")

#: how long abandoned events and batches get to let go of Postgres before their connections are cut
ABANDON_SECONDS = 5.0
#: how often the common queue's window is compared with what the byte budget allows now
WINDOW_CHECK_SECONDS = 0.5


class Consumer:
    """Consumes the work queue and the shards' own queues on one connection until the worker stops or the
    connection is lost."""

    def __init__(self, services: Services, fair: FairShares, stopping: asyncio.Event) -> None:
        self._services = services
        self._fair = fair
        self._stopping = stopping
        self._inflight: set[asyncio.Task[Any]] = set()
        self._background: set[asyncio.Task[Any]] = set()

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    async def run(self) -> None:
        """Connect, declare, consume; return after a graceful drain or once the connection is lost.

        Raises when the broker cannot be reached or the start-up declarations fail. A lost connection, a
        lost channel or a consumer the broker cancelled all end this connection's life the same way: what
        is in flight is let go (the broker redelivers it) and the runner connects again (worker/runner.py
        says why the worker does this itself rather than through aio-pika's ``connect_robust``)."""
        connection = await self._services.nodes.connect()
        lost = asyncio.Event()
        _ends_with(connection, lost)
        # a memory or disk alarm: logged, on /readyz and ltm_rabbitmq_blocked; publishes wait it out
        block = BrokerBlock(self._services.readiness.set_blocked)
        try:
            wiring = await self._open(connection, lost, block)
            await self._consume(wiring, lost)
            await first_of(self._stopping.wait(), lost.wait())
            if self._stopping.is_set() and not lost.is_set():
                await self._stop_gracefully(wiring)
            else:
                log.warning("rabbitmq connection lost; reconnecting", in_flight=len(self._inflight))
                await self._abandon_inflight()
        finally:
            for task in self._background:
                task.cancel()
            self._services.readiness.set_consuming(False)
            block.end("connection closed")
            await close_quietly(connection)

    async def _open(self, connection: AbstractConnection, lost: asyncio.Event, block: BrokerBlock) -> _Wiring:
        """The connection's channels (a publishing one in confirm mode, one per kind of queue consumed,
        each with its own acks: delivery tags are per channel, and one for moves to the shards' queues), the
        topology declared, the handler wired."""
        settings = self._services.settings
        publish_channel = await self._channel(connection, lost, confirms=True)
        watch_blocks((await publish_channel.get_underlay_channel()).connection, block)
        declared = await declare_topology(publish_channel, settings.topology, self._services.policy.tiers())
        common_channel = await self._channel(connection, lost)
        shard_channel = await self._channel(connection, lost, prefetch=settings.shard_prefetch)
        handler = self._services.handler_for(publish_channel, declared, self._stopping)
        # moves confirm on a channel of their own: a burst of them never delays the results and notices
        move_channel = await self._channel(connection, lost, confirms=True)
        mover = Publisher.for_topology(move_channel, declared)
        from_shard_queue = _Route(handler, mover, Acks(await shard_channel.get_underlay_channel()), None)
        shards = ShardQueues(
            connection=connection,
            consume_channel=shard_channel,
            topology=settings.topology,
            pool=self._services.pool,
            on_message=partial(self._on_message, from_shard_queue),
            limit=settings.shard_queues_max,
            spawn=self._spawn,
            on_recorded=self._services.metrics.label_shards,
        )
        from_common = _Route(handler, mover, Acks(await common_channel.get_underlay_channel()), shards)
        keeper = Keeper(
            await self._channel(connection, lost),
            self._services.pool,
            settings.topology,
            IdentityRule.of(settings).trusted,
        )
        queue = await common_channel.declare_queue(
            settings.topology.work_queue, durable=True, arguments=work_queue_arguments(settings.topology)
        )
        common = _Common(common_channel, queue, partial(self._on_message, from_common))
        return _Wiring(common_channel, shard_channel, common, shards, keeper)

    async def _consume(self, wiring: _Wiring, lost: asyncio.Event) -> None:
        """Start consuming the common queue and following the shards' own queues, under the byte budget."""
        # the broker may cancel a consumer itself (the queue was deleted, a node went away): aio-pika does
        # not restore it on a plain connection. The common queue's: start over (declare, consume); a shard
        # queue's: forget it, the next refresh consumes it again if it is still recorded
        (await wiring.common_channel.get_underlay_channel()).on_consumer_cancel_callbacks.add(
            lambda *_: self._consumer_cancelled(lost)
        )
        (await wiring.shard_channel.get_underlay_channel()).on_consumer_cancel_callbacks.add(
            lambda frame: wiring.shards.cancelled(frame.consumer_tag)
        )
        # the keeper first: once events flow, their results may get the connection blocked (a memory or disk
        # alarm), and a blocked connection's later frames are not read
        await wiring.keeper.start()
        await wiring.common.start(self._fair.window())
        self._spawn(wiring.shards.follow())
        self._spawn(self._keep_window(wiring.common, wiring.shards))
        self._services.readiness.set_consuming(True)
        settings = self._services.settings
        log.info(
            "consuming",
            queue=settings.topology.work_queue,
            prefetch=wiring.common.window,
            shard_prefetch=settings.shard_prefetch,
            concurrency=settings.concurrency,
            node=redact_url(self._services.nodes.current or ""),
        )

    async def _stop_gracefully(self, wiring: _Wiring) -> None:
        """A stop: take nothing more, then let what is in flight finish within the grace period."""
        await wiring.common.close()
        await wiring.shards.cancel_all()
        await self._drain()
        # after the drain: the copies of what the events in flight dead-lettered are kept by this worker too
        await wiring.keeper.stop()

    async def _channel(
        self,
        connection: AbstractConnection,
        lost: asyncio.Event,
        *,
        confirms: bool = False,
        prefetch: int | None = None,
    ) -> AbstractChannel:
        """A channel whose loss ends this connection's life; ``prefetch`` for the consumers started on it."""
        channel: AbstractChannel = await connection.channel(
            publisher_confirms=confirms, on_return_raises=confirms
        )
        _ends_with(channel, lost)
        if prefetch is not None:
            await channel.set_qos(prefetch_count=prefetch)
        return channel

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _consumer_cancelled(self, lost: asyncio.Event) -> None:
        if not self._stopping.is_set():
            log.warning("rabbitmq cancelled the consumer; reconnecting")
            lost.set()

    async def _on_message(self, route: _Route, message: AbstractIncomingMessage) -> None:
        """One delivery: admitted (:meth:`FairShares.admit`), then moved, handed back, or processed in its
        tenant's turn, as the ticket says."""
        task = asyncio.current_task()
        if task is not None:
            self._inflight.add(task)
        ticket = self._fair.admit(message, moves_to=route.shards)
        try:
            if ticket.first_sight is not None and route.shards is not None:
                route.shards.ask(ticket.first_sight)  # first sight of the shard: give it its own queue
            if ticket.action is Action.MOVE and await self._move(route, ticket, message):
                return
            if ticket.action is Action.HAND_BACK or not await self._fair.turn(ticket):
                # past the byte budget, or stopping before this event started: hand it back now, so
                # another worker takes it without waiting for this one's drain to end
                with contextlib.suppress(Exception):
                    await route.acks.nack(message, requeue=True)
                return
            await route.handler.handle(message, route.acks, read=ticket.read, sender=ticket.sender)
        except asyncio.CancelledError:
            pass
        finally:
            self._fair.done(ticket)
            if task is not None:
                self._inflight.discard(task)

    async def _move(self, route: _Route, ticket: Ticket, message: AbstractIncomingMessage) -> bool:
        """Copy an event of a shard over its share to the shard's own queue, then ack it; True when it left
        this worker (moved, turned away because the shard's queue is full, or its channel is gone), False to
        process it here after all."""
        shard_id = ticket.shard
        assert shard_id is not None
        assert route.shards is not None
        try:
            async with self._fair.moving:
                await route.mover.move(message, queue=route.shards.queue_of(shard_id), sender=ticket.sender)
        except BacklogFull as exc:
            kept = self._fair.letter_for_turned_away(shard_id)
            await route.handler.turn_away(
                message, route.acks, describe(exc), sender=ticket.sender, letter=kept, read=ticket.read
            )
            return True
        except Exception as exc:
            if message.channel.is_closed:
                return True  # neither moved nor acked: the broker redelivers it after the reconnect
            log.warning(
                "could not move an event to its shard's queue; processing it here", error=describe(exc)
            )
            return False
        guild = ticket.tenant.guild if isinstance(ticket.tenant, Guild) else None
        self._services.metrics.shard_moved(shard_id, guild)
        with contextlib.suppress(Exception):  # a lost channel: redelivered, and answered once by the ledger
            await route.acks.ack(message)
        return True

    async def _keep_window(self, common: _Common, shards: ShardQueues) -> None:
        """Keep what the worker is pushed within its byte budget: past ``LTM_HELD_BYTES_MAX`` take nothing
        more (neither from the common queue nor from the shards' own queues) until half of that is processed
        or moved, then consume again with the window the budget allows; meanwhile follow the window as the
        bodies' sizes change: narrowed at once when a body arrives that the window times it would take past
        the budget, widened (and narrowed) on the next check when off by half or more."""
        fair, hand = self._fair, self._fair.hand
        while not self._stopping.is_set():
            fair.in_use(common.window)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    first_of(hand.full.wait(), fair.too_wide.wait()), timeout=WINDOW_CHECK_SECONDS
                )
            if self._stopping.is_set():
                return
            if not hand.full.is_set():
                window, current = fair.window(), common.window
                if (fair.too_wide.is_set() and window < current) or not current // 2 < window < current * 2:
                    log.info("the common queue's window follows the bodies' size", prefetch=window)
                    await common.resize(window)
                continue
            log.warning(
                "holding too many event bytes; the queues wait",
                held_bytes=hand.bytes,
                held_events=hand.total,
                setting="LTM_HELD_BYTES_MAX",
            )
            await common.stop()
            await shards.pause()
            await first_of(hand.room.wait(), self._stopping.wait())
            if self._stopping.is_set():
                return
            await common.start(fair.window())
            await shards.resume()
            log.info("the queues are consumed again", held_bytes=hand.bytes, prefetch=common.window)

    async def _drain(self) -> None:
        """Graceful stop: no new deliveries, wait for in-flight events up to the grace period."""
        deadline = time.monotonic() + self._services.settings.shutdown_grace_seconds
        while self._inflight and time.monotonic() < deadline:
            await asyncio.wait(set(self._inflight), timeout=max(0.0, deadline - time.monotonic()))
        stuck = 0
        if self._inflight:
            log.warning("grace period over: in-flight events are requeued", requeued=len(self._inflight))
            stuck = await self._abandon_inflight()
        if stuck:
            # Cancelled events still wait for Postgres (a server that does not answer the cancel):
            # closing the channel would wait for them too. Cut their connections; the broker requeues
            # the events and the ledger answers any whose commit did go through.
            log.warning("postgres does not answer; closing its connections", stuck=stuck)
            self._services.pool.terminate()
        log.info("stopped cleanly")

    async def _abandon_inflight(self) -> int:
        """Cancel what is still running: the broker requeues the unacked deliveries, and the ledger answers
        any whose write had already committed. Returns how many events or batches are still stuck after
        5 s (waiting on a Postgres that does not answer the cancel)."""
        deadline = time.monotonic() + ABANDON_SECONDS
        tasks = set(self._inflight)
        for task in tasks:
            task.cancel()
        stuck_batches = await self._services.batcher.abandon(timeout=ABANDON_SECONDS)
        if tasks:
            await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
        return len(self._inflight) + stuck_batches


def _ends_with(closable: AbstractConnection | AbstractChannel, lost: asyncio.Event) -> None:
    """``lost`` is set when ``closable`` closes (whatever the reason)."""
    closable.close_callbacks.add(lambda *_: lost.set())


@dataclass(frozen=True, slots=True)
class _Route:
    """Where a delivery came from, and so how it is settled: its channel's acks; ``shards``, the queues a
    delivery of the common queue may be moved to (None for a delivery of a shard's own queue, never moved
    again)."""

    handler: EventHandler
    mover: Publisher
    acks: Acks
    shards: ShardQueues | None


@dataclass(frozen=True, slots=True)
class _Wiring:
    """What one connection consumes with, every part set: the consuming channels (their loss or a consumer
    the broker cancels ends the connection's life), the common queue's consumer and the shards' queues."""

    common_channel: AbstractChannel
    shard_channel: AbstractChannel
    common: _Common
    shards: ShardQueues
    #: the dead letters' copies, into Postgres
    keeper: Keeper


class _Common:
    """The common work queue's consumer, which the byte budget may stop and start again with another window
    (its prefetch: set on the channel before each consume, which is when RabbitMQ applies it)."""

    def __init__(self, channel: AbstractChannel, queue: AbstractQueue, on_message: Any) -> None:
        self._channel = channel
        self._queue = queue
        self._on_message = on_message
        self._tag: str | None = None
        self._closed = False
        #: the prefetch of the consumer now (or last)
        self.window = 0

    async def start(self, window: int) -> None:
        if self._tag is not None or self._closed:
            return
        if window != self.window:
            await self._channel.set_qos(prefetch_count=window)
            self.window = window
        self._tag = await self._queue.consume(self._on_message, no_ack=False)

    async def resize(self, window: int) -> None:
        """Consume with another window without a gap: the new consumer starts before the old one is
        cancelled (for a moment both take deliveries), so no event waits on the change."""
        if self._tag is None or self._closed or window == self.window:
            return
        old = self._tag
        await self._channel.set_qos(prefetch_count=window)
        self.window = window
        self._tag = await self._queue.consume(self._on_message, no_ack=False)
        try:
            await self._queue.cancel(old)
        except Exception as exc:
            log.warning("could not cancel the consumer", error=describe(exc))

    async def stop(self) -> None:
        """No new deliveries; what was delivered stays to be settled."""
        tag, self._tag = self._tag, None
        if tag is None:
            return
        try:
            await self._queue.cancel(tag)
        except Exception as exc:
            log.warning("could not cancel the consumer", error=describe(exc))

    async def close(self) -> None:
        """Stop for good (a graceful stop): nothing starts it again."""
        self._closed = True
        await self.stop()
