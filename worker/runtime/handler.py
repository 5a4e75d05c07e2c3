"""One delivery, from its body to its ack: read the envelope, process the event (Postgres), publish what it
emits, settle. A failed attempt goes where :func:`~worker.runtime.settle.route_failure` says. Every delivery
ends settled on every path; only a lost channel leaves it to the broker, which requeues it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Protocol
from uuid import UUID

import aio_pika.exceptions
import structlog
from aio_pika.abc import AbstractIncomingMessage

from contracts.models import DeadLetterKind, Status, ToolCallEvent
from worker.broker.acks import Acks
from worker.broker.content_header import undecodable
from worker.broker.envelope import RoutableIds, Unreadable, read_event
from worker.broker.headers import attempts_made, traceparent_of
from worker.broker.publisher import Publisher
from worker.broker.topology import retry_queue_name
from worker.config import Topology
from worker.faults import describe
from worker.observability.metrics import Metrics
from worker.observability.tracing import Attribute, EventSpan, EventTracer, in_step
from worker.pipeline import outcome
from worker.runtime.aio import side_by_side
from worker.runtime.settle import DeadLetter, RetryPolicy, route_failure
from worker.service.process import ProcessedEvent, failure_answer

log = structlog.get_logger("worker")

#: pause before a delivery the worker could not route is handed back (no hot loop through the broker)
UNSETTLED_REQUEUE_SECONDS = 1.0
#: attributes of the Postgres step (a child span): the event's whole trip through the batcher, i.e. its wait
#: for a batch, the batch's read and its ltm_save_events statement
_POSTGRES_STEP: dict[str, Attribute] = {
    "db.system.name": "postgresql",
    "db.operation.name": "ltm_save_events",
}


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
        publisher: Publisher,
        acks: Acks,
        invalidations: InvalidationSink,
        metrics: Metrics,
        tracer: EventTracer,
        policy: RetryPolicy,
        topology: Topology,
        stopping: asyncio.Event,
    ) -> None:
        self._processor = processor
        self._publisher = publisher
        self._acks = acks
        self._invalidations = invalidations
        self._metrics = metrics
        self._tracer = tracer
        self._policy = policy
        self._topology = topology
        self._stopping = stopping

    async def handle(self, message: AbstractIncomingMessage) -> None:
        """Handle one delivery and settle it (cancellation aside: the broker requeues what was not acked)."""
        try:
            await self._handle(message)
        except Exception as exc:  # a path that forgot a failure: still a bug, but not a stuck delivery
            log.error("unexpected error handling a delivery", error=describe(exc), exc_info=exc)
        await self._settle_leftover(message)

    async def _handle(self, message: AbstractIncomingMessage) -> None:
        started = time.monotonic()
        attempt = attempts_made(message) + 1
        left_out = undecodable(message.headers)
        if left_out:
            # the worker reads no property a shard must set: the event is processed, its copies say what
            # was left out (x-ltm-dropped)
            log.warning(
                "message properties could not be decoded; left out",
                fields=left_out,
                message_id=message.message_id,
            )
        parsed = read_event(message.body, message.message_id)
        if isinstance(parsed, Unreadable):
            await self._dead_letter_unreadable(message, parsed)
            return
        event = parsed
        self._metrics.observe_delivery(
            event.issued_at,
            headers=message.headers,
            timestamp=message.timestamp,
            redelivered=bool(message.redelivered),
        )
        # every log line of this event carries these; each delivery runs in a task of its own (aiormq), so
        # they stay with this event
        structlog.contextvars.bind_contextvars(
            event_id=str(event.event_id),
            tool_call_id=event.tool_call_id,
            shard_id=event.shard_id,
            attempts=attempt,
        )
        span_attributes: dict[str, Attribute] = {
            "messaging.message.id": str(event.event_id),
            "ltm.tool_call_id": event.tool_call_id,
            "ltm.shard_id": event.shard_id,
            "ltm.attempts": attempt,
        }
        with self._tracer.event_span(traceparent_of(message), span_attributes) as span:
            processed: ProcessedEvent | None = None
            self._metrics.in_flight.inc()
            try:
                with span.step("postgres ltm_save_events", _POSTGRES_STEP, kind="client"):
                    processed = await self._processor.process(event, attempt)
                if processed.conflict is not None:
                    await self._refuse_conflict(
                        message, event, attempt, processed.conflict.stored_shard_id, span
                    )
                    return
                span.set(
                    {
                        "ltm.status": processed.status,
                        "ltm.memory_id": processed.memory_id,
                        "ltm.replayed": processed.replayed,
                    }
                )
                await self._publish(event, processed, span)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                span.fail(exc)
                await self._fail(message, event, attempt, exc, committed=processed is not None, span=span)
                return
            finally:
                self._metrics.in_flight.dec()
            if not await self._ack(message):
                return  # the channel closed: the broker redelivers it, and the ledger answers it
            elapsed = time.monotonic() - started
            self._metrics.observe_answered(event.issued_at)
            self._metrics.events.labels(processed.status).inc()
            self._metrics.duration.observe(elapsed)
            if processed.replayed:
                self._metrics.replayed.inc()
            if processed.memory_id is not None:
                log.debug("memory content", content=processed.result.data.get("content_saved"))
            log.info(
                "event processed",
                status=processed.status,
                memory_id=processed.memory_id,
                replayed=processed.replayed,
                duration_ms=round(elapsed * 1000, 1),
            )

    async def _publish(self, event: ToolCallEvent, processed: ProcessedEvent, span: EventSpan) -> None:
        """Result and notice (confirmed) and the invalidation, side by side: all must succeed before the ack,
        none waits for another. The invalidation succeeds once it is in Redis or pending in the outbox.
        Each is a step (child span) of the event's span."""
        publish = self._publisher.publish_outputs(
            event_id=event.event_id,
            tool_call_id=event.tool_call_id,
            shard_id=event.shard_id,
            result=processed.result,
            notification=processed.notification,
            traceparent=span.traceparent,
        )
        exchange, channel = self._topology.results_exchange, self._topology.invalidation_channel
        sent: dict[str, Attribute] = {
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "publish",
            "messaging.destination.name": exchange,
            "ltm.notice": processed.notification is not None,  # the notice goes to tomori.notifications
        }
        outputs = in_step(span, f"{exchange} publish", sent, publish, kind="producer")
        if processed.invalidation is None:
            await outputs
            return
        invalidate = self._invalidations.publish(event.event_id, processed.invalidation)
        sent = {
            "messaging.system": "redis",
            "messaging.operation.type": "publish",
            "messaging.destination.name": channel,
        }
        await side_by_side(outputs, in_step(span, f"{channel} publish", sent, invalidate, kind="producer"))

    async def _refuse_conflict(
        self,
        message: AbstractIncomingMessage,
        event: ToolCallEvent,
        attempt: int,
        stored_shard_id: int,
        span: EventSpan,
    ) -> None:
        """The event's id is in the ledger for a different event: dead-letter it as ``event_conflict`` and
        answer its shard with the refusal (never the stored outcome, never a notice or an invalidation).
        The log line names both shards and nothing of either event's content."""
        log.warning("event id conflict", stored_shard_id=stored_shard_id)
        span.set({"ltm.status": Status.INTERNAL_ERROR, "ltm.event_conflict": True})
        ids = RoutableIds(event.event_id, event.tool_call_id, event.shard_id, event.tool_name)
        try:
            await self._dead_letter(
                message,
                DeadLetterKind.EVENT_CONFLICT,
                "event_id conflict: the ledger holds this event_id for a different event",
                attempt,
                ids,
                outcome.event_conflict(),
                traceparent=span.traceparent,
            )
        except Exception as exc:  # the DLQ copy was refused or not confirmed: handed back (_settle_leftover)
            log.warning("could not route a failed event; it will be redelivered", error=describe(exc))

    async def _dead_letter_unreadable(self, message: AbstractIncomingMessage, parsed: Unreadable) -> None:
        event_id = str(parsed.ids.event_id) if parsed.ids else None
        failure = outcome.internal_error(parsed.kind) if parsed.ids else None
        try:
            await self._dead_letter(
                message,
                parsed.kind,
                parsed.error,
                1,
                parsed.ids,
                failure,
                traceparent=traceparent_of(message),
            )
        except Exception as exc:  # the DLQ copy was refused or not confirmed: nothing was acked
            log.warning(
                "could not dead-letter an unreadable event; it will be redelivered",
                kind=parsed.kind,
                event_id=event_id,
                error=describe(exc),
            )
            return
        log.warning("dead-lettered unreadable event", kind=parsed.kind, error=parsed.error, event_id=event_id)

    async def _fail(
        self,
        message: AbstractIncomingMessage,
        event: ToolCallEvent,
        attempt: int,
        exc: Exception,
        *,
        committed: bool,
        span: EventSpan,
    ) -> None:
        """Carry out :func:`route_failure`'s decision for a failed attempt."""
        reason = describe(exc)
        if channel_closed(message):
            # the connection is gone: this delivery can be neither routed nor acked, and the broker
            # redelivers it after the reconnect (answered from the ledger if it committed)
            log.warning("connection lost mid-event; it will be redelivered", error=reason)
            return
        decision = route_failure(exc, attempt, committed=committed, policy=self._policy)
        try:
            if isinstance(decision, DeadLetter):
                if decision.kind == DeadLetterKind.INTERNAL:
                    log.error("internal error; dead-lettered", error=reason, exc_info=exc)
                else:
                    log.error("transient fault outlasted every retry; dead-lettered", error=reason)
                span.set({"ltm.status": decision.failure.status if decision.failure else None})
                ids = RoutableIds(event.event_id, event.tool_call_id, event.shard_id, event.tool_name)
                await self._dead_letter(
                    message,
                    decision.kind,
                    reason,
                    decision.attempts,
                    ids,
                    decision.failure,
                    traceparent=span.traceparent,
                )
            else:
                queue = retry_queue_name(self._topology, decision.tier_ms)
                await self._publisher.retry_later(
                    message, queue=queue, attempts=decision.attempts, delay_ms=decision.delay_ms
                )
                self._metrics.retries.inc()
                await self._ack(message)
                log.warning("transient fault; retrying later", error=reason, retry_in_ms=decision.delay_ms)
        except Exception as routing_error:
            # the broker refused the retry or dead-letter copy: the delivery is handed back to the work
            # queue (see _settle_leftover), or requeued by the broker if the connection is gone
            log.warning(
                "could not route a failed event; it will be redelivered",
                error=describe(routing_error),
            )

    async def _dead_letter(
        self,
        message: AbstractIncomingMessage,
        kind: DeadLetterKind,
        error: str,
        attempts: int,
        ids: RoutableIds | None,
        failure: outcome.Outcome | None,
        *,
        traceparent: str | None,
    ) -> None:
        """DLQ copy first (confirmed), then the failure result for a waiting shard, then the ack.

        Once the DLQ copy is confirmed the delivery is acked whatever becomes of the failure result: the
        dead letter is the record (a replay answers the shard), and an unacked delivery would come back
        and be dead-lettered again. The DLQ copy keeps the event's own headers; the failure result carries
        ``traceparent``."""
        await self._publisher.dead_letter(message, kind=kind, error=error, attempts=attempts)
        self._metrics.dead_letters.labels(kind).inc()
        if ids is not None and failure is not None:
            try:
                await self._publisher.publish_outputs(
                    event_id=ids.event_id,
                    tool_call_id=ids.tool_call_id,
                    shard_id=ids.shard_id,
                    result=failure_answer(ids, failure),
                    notification=None,
                    traceparent=traceparent,
                )
            except Exception as exc:
                log.warning(
                    "failure result not delivered; the dead letter keeps the event",
                    event_id=str(ids.event_id),
                    shard_id=ids.shard_id,
                    kind=kind,
                    error=describe(exc),
                )
        await self._ack(message)

    async def _settle_leftover(self, message: AbstractIncomingMessage) -> None:
        """Every delivery ends settled: one the handler could neither ack nor route (the broker refused a
        retry or dead-letter copy) is handed back after a pause, so it does not hold a prefetch slot until
        the connection closes. Each hand-back counts toward the work queue's delivery limit, so a delivery
        that can never be routed reaches the DLQ through the broker, never loops for ever."""
        if self._acks.settled(delivery_tag(message)) or channel_closed(message):
            return  # settled, or the broker requeues it with the channel
        log.warning(
            "delivery not settled; handing it back to the queue",
            message_id=message.message_id,
            delivery_tag=message.delivery_tag,
            retry_in_s=UNSETTLED_REQUEUE_SECONDS,
        )
        if not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=UNSETTLED_REQUEUE_SECONDS)
        try:
            await self._acks.nack(delivery_tag(message), requeue=True)
        except Exception as exc:
            log.warning("could not hand a delivery back; the broker requeues it", error=describe(exc))

    async def _ack(self, message: AbstractIncomingMessage) -> bool:
        """Ack ``message`` (with the acks of its turn: :class:`worker.broker.acks.Acks`); False when its
        channel is gone (the broker then redelivers it)."""
        try:
            await self._acks.ack(delivery_tag(message))
        except Exception as exc:
            log.warning(
                "ack failed; the broker redelivers the event",
                message_id=message.message_id,
                error=describe(exc),
            )
            return False
        return True


def delivery_tag(message: AbstractIncomingMessage) -> int:
    """The delivery's tag on its channel (every delivery of a consumer has one)."""
    assert message.delivery_tag is not None
    return message.delivery_tag


def channel_closed(message: AbstractIncomingMessage) -> bool:
    """True when the delivery's channel is gone (its connection lost): the broker requeues it then."""
    try:
        return bool(message.channel.is_closed)
    except aio_pika.exceptions.ChannelInvalidStateError:  # aio-pika's way of saying "closed"
        return True
