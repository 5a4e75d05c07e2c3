"""One connection's life: channels, topology, consume the common work queue and every shard's own queue,
serve the shards in turn, then drain on a stop or abandon what is in flight when the connection is lost
(the broker redelivers it, the ledger answers it).

Fair shares (docs/fair-shares.md): the common queue pushes up to ``LTM_PREFETCH`` deliveries ahead, so a
shard's burst leaves it at once and the next shard's event is not stuck behind it; every held delivery waits
for a slot under its shard (:class:`~worker.runtime.slots.Slots`: one event per shard per turn); once the
worker is half full, a shard holding more than its share has its next events moved to its own queue
(:class:`~worker.runtime.hand.Hand`), where it waits under its own bound; and past ``LTM_HELD_BYTES_MAX``
the worker stops taking from the common queue until half of that is processed or moved.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Hashable
from dataclasses import dataclass
from functools import partial
from typing import Any

import structlog
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage, AbstractQueue

from worker.aio import close_quietly, first_of
from worker.broker.acks import Acks
from worker.broker.blocking import BrokerBlock
from worker.broker.blocking import watch as watch_blocks
from worker.broker.envelope import shard_of
from worker.broker.headers import from_worker, sender_of
from worker.broker.publisher import BacklogFull, Publisher
from worker.broker.topology import declare_topology, work_queue_arguments
from worker.redact import describe, redact_url
from worker.runtime.delivery import delivery_tag
from worker.runtime.hand import Hand
from worker.runtime.handler import EventHandler
from worker.runtime.services import Services
from worker.runtime.shards import ShardQueues
from worker.runtime.slots import Slots
from worker.service.identity import IdentityRule

log = structlog.get_logger("worker")

#: how long abandoned events and batches get to let go of Postgres before their connections are cut
ABANDON_SECONDS = 5.0
#: moves awaiting the broker's confirm at once: a loud shard's excess goes to its queue this many at a time,
#: on a channel of its own, so thousands of copies never queue ahead of another shard's result and notice
MOVES_IN_FLIGHT = 32


class Consumer:
    """Consumes the work queue and the shards' own queues on one connection until the worker stops or the
    connection is lost."""

    def __init__(self, services: Services, slots: Slots, stopping: asyncio.Event) -> None:
        self._services = services
        self._slots = slots
        self._stopping = stopping
        settings = services.settings
        self._identity = IdentityRule.of(settings)
        self._hand = Hand(settings.prefetch, settings.held_bytes_max, on_change=services.metrics.shard_held)
        self._inflight: set[asyncio.Task[Any]] = set()
        self._background: set[asyncio.Task[Any]] = set()
        self._moving = asyncio.Semaphore(MOVES_IN_FLIGHT)

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
        common_channel = await self._channel(connection, lost, prefetch=settings.prefetch)
        shard_channel = await self._channel(connection, lost, prefetch=settings.shard_prefetch)
        handler = self._services.handler_for(publish_channel, declared, self._stopping)
        # moves confirm on a channel of their own: a burst of them never delays the results and notices
        move_channel = await self._channel(connection, lost, confirms=True)
        mover = Publisher.for_topology(move_channel, declared)
        shard_acks = Acks(await shard_channel.get_underlay_channel())
        shards = ShardQueues(
            connection=connection,
            consume_channel=shard_channel,
            topology=settings.topology,
            pool=self._services.pool,
            on_message=partial(self._on_message, handler, mover, shard_acks, None),
            limit=settings.shard_queues_max,
        )
        common_acks = Acks(await common_channel.get_underlay_channel())
        queue = await common_channel.declare_queue(
            settings.topology.work_queue, durable=True, arguments=work_queue_arguments(settings.topology)
        )
        common = _Common(queue, partial(self._on_message, handler, mover, common_acks, shards))
        return _Wiring(common_channel, shard_channel, common, shards)

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
        await wiring.common.start()
        self._spawn(wiring.shards.follow())
        self._spawn(self._hold_to_budget(wiring.common, wiring.shards))
        self._services.readiness.set_consuming(True)
        settings = self._services.settings
        log.info(
            "consuming",
            queue=settings.topology.work_queue,
            prefetch=settings.prefetch,
            shard_prefetch=settings.shard_prefetch,
            concurrency=settings.concurrency,
            node=redact_url(self._services.nodes.current or ""),
        )

    async def _stop_gracefully(self, wiring: _Wiring) -> None:
        """A stop: take nothing more, then let what is in flight finish within the grace period."""
        await wiring.common.stop()
        await wiring.shards.cancel_all()
        await self._drain()

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

    async def _on_message(
        self,
        handler: EventHandler,
        mover: Publisher,
        acks: Acks,
        shards: ShardQueues | None,
        message: AbstractIncomingMessage,
    ) -> None:
        """One delivery: held under its shard, moved to the shard's own queue when the shard holds more than
        its share (only from the common queue: ``shards`` is given there), else processed in its turn."""
        task = asyncio.current_task()
        if task is not None:
            self._inflight.add(task)
        key: Hashable = shard_of(message.body)
        size = len(message.body)
        self._hand.add(key, size)
        try:
            if not from_worker(message) and isinstance(key, int):
                self._services.metrics.shard_received(key)
            if shards is not None and isinstance(key, int):
                if not shards.has(key):
                    self._spawn(shards.ensure(key))  # first sight of the shard: give it its own queue
                elif self._hand.moves(key) and await self._move(handler, mover, acks, shards, key, message):
                    return
            if not await self._slots.take(key):
                # stopping before this event started: hand it back now, so another worker takes it
                # without waiting for this one's drain to end
                with contextlib.suppress(Exception):
                    await acks.nack(delivery_tag(message), requeue=True)
                return
            try:
                await handler.handle(message, acks)
            finally:
                self._slots.release(key)
        except asyncio.CancelledError:
            pass
        finally:
            self._hand.remove(key, size)
            if task is not None:
                self._inflight.discard(task)

    async def _move(
        self,
        handler: EventHandler,
        mover: Publisher,
        acks: Acks,
        shards: ShardQueues,
        shard_id: int,
        message: AbstractIncomingMessage,
    ) -> bool:
        """Move an event of a shard over its share to the shard's own queue, then ack it; True when it left
        this worker (moved, or turned away because the shard's queue is full), False to process it here."""
        sender = sender_of(message, self._identity.trusted)
        try:
            async with self._moving:
                await mover.move(message, queue=shards.queue_of(shard_id), sender=sender)
        except BacklogFull as exc:
            await handler.turn_away(message, acks, describe(exc))
            return True
        except Exception as exc:
            if message.channel.is_closed:
                return True  # neither moved nor acked: the broker redelivers it after the reconnect
            log.warning(
                "could not move an event to its shard's queue; processing it here", error=describe(exc)
            )
            return False
        self._services.metrics.shard_moved(shard_id)
        with contextlib.suppress(Exception):  # a lost channel: redelivered, and answered once by the ledger
            await acks.ack(delivery_tag(message))
        return True

    async def _hold_to_budget(self, common: _Common, shards: ShardQueues) -> None:
        """Take nothing more (neither from the common queue nor from the shards' own queues) while the bodies
        held are over ``LTM_HELD_BYTES_MAX``, until half of that is processed or moved."""
        hand = self._hand
        while True:
            await hand.over_budget_event.wait()
            log.warning(
                "holding too many event bytes; the queues wait",
                held_bytes=hand.bytes,
                held_events=hand.total,
                setting="LTM_HELD_BYTES_MAX",
            )
            await common.stop()
            await shards.pause()
            await hand.under_budget.wait()
            if self._stopping.is_set():
                return
            await common.start()
            await shards.resume()
            log.info("the queues are consumed again", held_bytes=hand.bytes)

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
class _Wiring:
    """What one connection consumes with, every part set: the consuming channels (their loss or a consumer
    the broker cancels ends the connection's life), the common queue's consumer and the shards' queues."""

    common_channel: AbstractChannel
    shard_channel: AbstractChannel
    common: _Common
    shards: ShardQueues


class _Common:
    """The common work queue's consumer, which the byte budget may stop and start again."""

    def __init__(self, queue: AbstractQueue, on_message: Any) -> None:
        self._queue = queue
        self._on_message = on_message
        self._tag: str | None = None

    async def start(self) -> None:
        if self._tag is None:
            self._tag = await self._queue.consume(self._on_message, no_ack=False)

    async def stop(self) -> None:
        """No new deliveries; what was delivered stays to be settled."""
        tag, self._tag = self._tag, None
        if tag is None:
            return
        try:
            await self._queue.cancel(tag)
        except Exception as exc:
            log.warning("could not cancel the consumer", error=describe(exc))
