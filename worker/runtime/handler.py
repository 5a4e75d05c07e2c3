"""One delivery, from its body to its ack: read the envelope, process the event (Postgres), publish what it
emits, settle. Where a failed delivery goes is :mod:`worker.service.policy`'s choice, and
:class:`~worker.runtime.delivery.Delivery` carries it out. What is reported about it (metrics, log lines,
span) is :mod:`worker.observability.telemetry`'s. Every delivery ends settled on every path; only a lost
channel leaves it to the broker, which requeues it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol
from uuid import UUID

import structlog
from aio_pika.abc import AbstractIncomingMessage

from contracts.models import ToolCallEvent
from worker.aio import side_by_side
from worker.broker.acks import Acks
from worker.broker.envelope import RoutableIds, Unreadable, read_event
from worker.broker.headers import TURNED_AWAY, Sender, attempts_made, sender_of, traceparent_of
from worker.broker.topology import retry_queue_name
from worker.config import Topology
from worker.observability.telemetry import EventTelemetry, EventTrace
from worker.redact import describe
from worker.runtime.delivery import Delivery, Outputs
from worker.service.identity import IdentityRule, Refused
from worker.service.policy import (
    CONFLICT_ERROR,
    DeadLetter,
    Retry,
    RetryPolicy,
    route_backlog_full,
    route_conflict,
    route_failure,
    route_unreadable,
    route_unverified,
)
from worker.service.process import ProcessedEvent

log = structlog.get_logger("worker")


class EventProcessor(Protocol):
    """Processes an event exactly once against Postgres (:class:`worker.service.batcher.Batcher`)."""

    async def process(self, event: ToolCallEvent, attempts: int = 1) -> ProcessedEvent: ...


class InvalidationSink(Protocol):
    """Gets an invalidation to Redis, now or later (the outbox's :class:`InvalidationOutbox`)."""

    async def publish(self, event_id: UUID, invalidation: dict[str, Any]) -> None: ...


class EventHandler:
    """Handles the deliveries of one connection; every dependency is there for its whole life."""

    def __init__(
        self,
        *,
        processor: EventProcessor,
        publisher: Outputs,
        invalidations: InvalidationSink,
        telemetry: EventTelemetry,
        policy: RetryPolicy,
        identity: IdentityRule,
        topology: Topology,
        stopping: asyncio.Event,
    ) -> None:
        self._processor = processor
        self._publisher = publisher
        self._invalidations = invalidations
        self._telemetry = telemetry
        self._policy = policy
        self._identity = identity
        self._topology = topology
        self._stopping = stopping

    async def handle(
        self,
        message: AbstractIncomingMessage,
        acks: Acks,
        *,
        read: ToolCallEvent | Unreadable | None = None,
        sender: Sender | None = None,
    ) -> None:
        """Handle one delivery and settle it through its channel's ``acks`` (cancellation aside: the broker
        requeues what was not acked). ``read`` and ``sender``: the body and its sender as admission found
        them (:class:`~worker.runtime.fair.FairShares`), read here when not given."""
        if sender is None:
            sender = sender_of(message, self._identity.trusted)
        delivery = Delivery(message, acks, self._publisher, sender)
        try:
            await self._handle(delivery, read)
        except Exception as exc:  # a path that forgot a failure: still a bug, but not a stuck delivery
            log.error("unexpected error handling a delivery", error=describe(exc), exc_info=exc)
        await delivery.hand_back(self._stopping)  # one left unsettled (a copy the broker refused)

    async def turn_away(
        self,
        message: AbstractIncomingMessage,
        acks: Acks,
        error: str,
        *,
        sender: Sender,
        letter: int | None,
        read: ToolCallEvent | Unreadable | None = None,
    ) -> None:
        """An event its shard's own queue has no room for (the shard is over its bound): its shard answered
        ("try again later") when its ids can be read, nothing written. ``letter``: None, the event is not
        kept (the shard's flood keeps one dead letter a minute); else it is dead-lettered as
        ``shard_backlog_full``, with ``letter`` (the shard's events answered without a letter since its
        last one) in ``x-ltm-turned-away``. ``read``: the body as admission read it (else read here)."""
        delivery = Delivery(message, acks, self._publisher, sender)
        event = read if read is not None else read_event(message.body, message.message_id)
        ids = event.ids if isinstance(event, Unreadable) else _ids_of(event)
        decision = route_backlog_full(attempts_made(message) + 1, answered=ids is not None)
        traceparent = traceparent_of(message)
        try:
            if letter is None and not await delivery.answer_unkept(decision, ids, traceparent=traceparent):
                letter = 0
            if letter is not None:
                await delivery.dead_letter(
                    decision, error, ids, traceparent=traceparent, headers={TURNED_AWAY: letter}
                )
        except Exception as exc:
            log.warning("could not turn away an event; it will be redelivered", error=describe(exc))
        else:
            self._telemetry.turned_away(ids.shard_id if ids else None, error, letter=letter)
        await delivery.hand_back(self._stopping)

    async def _handle(self, delivery: Delivery, read: ToolCallEvent | Unreadable | None) -> None:
        message = delivery.message
        started = self._telemetry.received(message)
        attempt = attempts_made(message) + 1
        event = read if read is not None else read_event(message.body, message.message_id)
        if isinstance(event, Unreadable):
            try:
                decision = route_unreadable(event)
                await delivery.dead_letter(
                    decision, event.error, event.ids, traceparent=traceparent_of(message)
                )
            except Exception as exc:  # the DLQ copy was refused or not confirmed: nothing was acked
                self._telemetry.unreadable(event, refused=exc)
            else:
                self._telemetry.unreadable(event)
            return
        refused = self._identity.check(
            delivery.sender.user, event.shard_id, trusted_sender=delivery.sender.trusted
        )
        if refused is not None:
            await self._refuse(delivery, event, refused, attempt)
            return
        with self._telemetry.delivered(message, event, attempt, started, sender=delivery.sender) as trace:
            processed: ProcessedEvent | None = None
            with trace.in_flight():
                try:
                    with trace.postgres():
                        processed = await self._processor.process(event, attempt)
                    if processed.conflict is None:
                        trace.processed(processed)
                        await self._publish(event, processed, trace)
                except Exception as exc:
                    trace.failed(exc)
                    if delivery.channel_closed:  # neither routed nor acked: redelivered after the reconnect
                        log.warning("connection lost mid-event; it will be redelivered", error=describe(exc))
                        return
                    failed = route_failure(exc, attempt, committed=processed is not None, policy=self._policy)
                    trace.routing(failed, exc)
                    await self._route(delivery, failed, describe(exc), event, trace)
                    return
                if processed.conflict is not None:  # the event's id is in the ledger for a different event
                    trace.conflict(processed.conflict.stored_shard_id)
                    await self._route(delivery, route_conflict(attempt), CONFLICT_ERROR, event, trace)
                    return
            # False: the channel closed; the broker redelivers the event, and the ledger answers it
            if await delivery.ack():
                trace.answered(processed)

    async def _publish(self, event: ToolCallEvent, processed: ProcessedEvent, trace: EventTrace) -> None:
        """Result and notice (confirmed) and the invalidation, side by side: all must succeed before the ack,
        none waits for another. The invalidation succeeds once it is in Redis or pending in the outbox."""
        outputs = trace.publishing(
            self._publisher.publish_outputs(
                event_id=event.event_id,
                tool_call_id=event.tool_call_id,
                shard_id=event.shard_id,
                result=processed.result,
                notification=processed.notification,
                traceparent=trace.traceparent,
            ),
            notice=processed.notification is not None,
        )
        if processed.invalidation is None:
            await outputs
            return
        invalidate = self._invalidations.publish(event.event_id, processed.invalidation)
        await side_by_side(outputs, trace.invalidating(invalidate))

    async def _refuse(self, delivery: Delivery, event: ToolCallEvent, refused: Refused, attempt: int) -> None:
        """An event whose sender may not speak for its shard: dead-lettered as ``unverified_shard`` before
        anything is read or written; the answer goes to the sender's own shard, if it is one, never to the
        shard the event names."""
        answer_to = refused.sender_shard
        ids = (
            RoutableIds(event.event_id, event.tool_call_id, answer_to, event.tool_name)
            if answer_to is not None
            else None
        )
        decision = route_unverified(attempt)
        try:
            await delivery.dead_letter(
                decision, refused.reason, ids, traceparent=traceparent_of(delivery.message)
            )
        except Exception as exc:
            log.warning(
                "could not dead-letter an unverified event; it will be redelivered", error=describe(exc)
            )
            return
        self._telemetry.refused(event, refused.reason, sender=delivery.sender.user, answered_shard=answer_to)

    async def _route(
        self,
        delivery: Delivery,
        decision: Retry | DeadLetter,
        error: str,
        event: ToolCallEvent,
        trace: EventTrace,
    ) -> None:
        """Park a failed event in its retry queue or dead-letter it, then ack it. A copy the broker refuses
        leaves it unacked: handed back (:meth:`Delivery.hand_back`), or requeued with a lost channel."""
        try:
            if isinstance(decision, Retry):
                await delivery.retry(decision, retry_queue_name(self._topology, decision.tier_ms), error)
            else:
                await delivery.dead_letter(decision, error, _ids_of(event), traceparent=trace.traceparent)
        except Exception as exc:
            log.warning("could not route a failed event; it will be redelivered", error=describe(exc))
            return
        trace.routed(decision, error)


def _ids_of(event: ToolCallEvent) -> RoutableIds:
    return RoutableIds(event.event_id, event.tool_call_id, event.shard_id, event.tool_name)
