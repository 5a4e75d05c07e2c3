"""One connection's life: channels, topology, consume with a bounded prefetch, then drain on a stop or
abandon what is in flight when the connection is lost (the broker redelivers it, the ledger answers it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import structlog
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue

from worker.bootstrap import Services
from worker.broker.acks import Acks
from worker.broker.blocking import BrokerBlock
from worker.broker.blocking import watch as watch_blocks
from worker.broker.topology import declare_topology, work_queue_arguments
from worker.redact import describe, redact_url
from worker.runtime.aio import close_quietly, first_of
from worker.runtime.delivery import delivery_tag
from worker.runtime.handler import EventHandler
from worker.runtime.slots import Slots

log = structlog.get_logger("worker")

#: how long abandoned events and batches get to let go of Postgres before their connections are cut
ABANDON_SECONDS = 5.0


class Consumer:
    """Consumes the work queue on one connection until the worker stops or the connection is lost."""

    def __init__(self, services: Services, slots: Slots, stopping: asyncio.Event) -> None:
        self._services = services
        self._slots = slots
        self._stopping = stopping
        self._inflight: set[asyncio.Task[Any]] = set()
        self._handler: EventHandler | None = None
        self._acks: Acks | None = None

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    async def run(self) -> None:
        """Connect, declare, consume; return after a graceful drain or once the connection is lost.

        Raises when the broker cannot be reached or the start-up declarations fail."""
        settings = self._services.settings
        topology = settings.topology
        nodes = self._services.nodes
        connection = await nodes.connect()
        lost = asyncio.Event()
        connection.close_callbacks.add(lambda *_: lost.set())
        # a memory or disk alarm: logged, on /readyz and ltm_rabbitmq_blocked; publishes wait it out
        block = BrokerBlock(self._services.readiness.set_blocked)
        try:
            publish_channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            publish_channel.close_callbacks.add(lambda *_: lost.set())
            watch_blocks((await publish_channel.get_underlay_channel()).connection, block)
            policy = self._services.policy
            declared = await declare_topology(publish_channel, topology, policy.tiers())
            consume_channel = await connection.channel(publisher_confirms=False)
            consume_channel.close_callbacks.add(lambda *_: lost.set())
            await consume_channel.set_qos(prefetch_count=settings.prefetch)
            # delivery tags are per channel: a new channel, new acks
            underlay = await consume_channel.get_underlay_channel()
            self._acks = Acks(underlay)
            self._handler = self._services.handler_for(publish_channel, declared, self._acks, self._stopping)
            queue = await consume_channel.declare_queue(
                topology.work_queue, durable=True, arguments=work_queue_arguments(topology)
            )
            # the broker may cancel the consumer itself (the queue was deleted, a node went away): aio-pika
            # does not restore it, so treat it like a lost connection and start over (declare, consume)
            underlay.on_consumer_cancel_callbacks.add(lambda *_: self._consumer_cancelled(lost))
            tag = await queue.consume(self._on_message, no_ack=False)
            self._services.readiness.set_consuming(True)
            log.info(
                "consuming",
                queue=queue.name,
                prefetch=settings.prefetch,
                concurrency=settings.concurrency,
                node=redact_url(nodes.current or ""),
            )
            await first_of(self._stopping.wait(), lost.wait())
            if self._stopping.is_set() and not lost.is_set():
                await self._drain(queue, tag)
            else:
                log.warning("rabbitmq connection lost; reconnecting", in_flight=len(self._inflight))
                await self._abandon_inflight()
        finally:
            self._services.readiness.set_consuming(False)
            block.end("connection closed")
            await close_quietly(connection)

    def _consumer_cancelled(self, lost: asyncio.Event) -> None:
        if not self._stopping.is_set():
            log.warning("rabbitmq cancelled the consumer; reconnecting")
            lost.set()

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._inflight.add(task)
        try:
            if not await self._slots.take():
                # stopping before this event started: hand it back now, so another worker takes it
                # without waiting for this one's drain to end
                assert self._acks is not None  # set before the consumer starts
                with contextlib.suppress(Exception):
                    await self._acks.nack(delivery_tag(message), requeue=True)
                return
            try:
                assert self._handler is not None  # set before the consumer starts
                await self._handler.handle(message)
            finally:
                self._slots.release()
        except asyncio.CancelledError:
            pass
        finally:
            if task is not None:
                self._inflight.discard(task)

    async def _drain(self, queue: AbstractQueue, tag: str) -> None:
        """Graceful stop: no new deliveries, wait for in-flight events up to the grace period."""
        try:
            await queue.cancel(tag)
        except Exception as exc:
            log.warning("could not cancel the consumer", error=describe(exc))
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
