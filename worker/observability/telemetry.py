"""What handling an event tells the operator: its metrics, its log lines and their bound fields, its span
and the span's steps (docs/operating.md).

The handler (:mod:`worker.runtime.handler`) says what happened to a delivery; this module says how that is
reported. :class:`EventTelemetry` serves every delivery of a connection. :meth:`EventTelemetry.delivered`
opens an :class:`EventTrace` for one readable event. A body that is no event has no span and no event
fields: :meth:`EventTelemetry.unreadable` reports it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Coroutine, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

import structlog
from aio_pika.abc import AbstractIncomingMessage

from contracts.models import DeadLetterKind, Status, ToolCallEvent
from worker.broker.content_header import undecodable
from worker.broker.envelope import Unreadable
from worker.broker.headers import Sender, traceparent_of
from worker.config import Topology
from worker.observability.metrics import Metrics
from worker.observability.tracing import Attribute, EventSpan, EventTracer, in_step
from worker.redact import describe
from worker.service.policy import DeadLetter, Retry
from worker.service.process import ProcessedEvent

log = structlog.get_logger("worker")

T = TypeVar("T")

#: attributes of the Postgres step (a child span): the event's whole trip through the batcher, i.e. its wait
#: for a batch, the batch's read and its ltm_save_events statement
_POSTGRES_STEP: dict[str, Attribute] = {
    "db.system.name": "postgresql",
    "db.operation.name": "ltm_save_events",
}


class EventTelemetry:
    """The metrics, log lines and spans of the events of one connection's handler."""

    def __init__(self, metrics: Metrics, tracer: EventTracer, topology: Topology) -> None:
        self._metrics = metrics
        self._tracer = tracer
        self._topology = topology

    def received(self, message: AbstractIncomingMessage) -> float:
        """A delivery came in. Returns when its handling started (monotonic clock), for
        ``ltm_event_duration_seconds``."""
        started = time.monotonic()
        left_out = undecodable(message.headers)
        if left_out:
            # the worker reads no property a shard must set: the event is processed, its copies say what
            # was left out (x-ltm-dropped)
            log.warning(
                "message properties could not be decoded; left out",
                fields=left_out,
                message_id=message.message_id,
            )
        return started

    @contextmanager
    def delivered(
        self,
        message: AbstractIncomingMessage,
        event: ToolCallEvent,
        attempt: int,
        started: float,
        *,
        sender: Sender | None = None,
    ) -> Iterator[EventTrace]:
        """The event's span, around its handling. Its queue wait and age are observed. Its ids are bound to
        every log line logged from here on. An event with no ``sender`` is counted by shard (accepted as
        contract version 1 allows, ``LTM_SHARD_IDENTITY=checked``)."""
        self._metrics.observe_delivery(
            event.issued_at,
            headers=message.headers,
            timestamp=message.timestamp,
            redelivered=bool(message.redelivered),
            shard_id=event.shard_id,
        )
        if sender is not None and sender.user is None:
            self._metrics.shard_without_user_id(event.shard_id)
        # each delivery runs in a task of its own (aiormq), so these stay with this event
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
            yield EventTrace(span, self._metrics, self._topology, event, started)

    def unreadable(self, parsed: Unreadable, refused: Exception | None = None) -> None:
        """A body that is no event was dead-lettered, or its DLQ copy was ``refused`` (nothing was acked)."""
        event_id = str(parsed.ids.event_id) if parsed.ids else None
        if refused is not None:
            log.warning(
                "could not dead-letter an unreadable event; it will be redelivered",
                kind=parsed.kind,
                event_id=event_id,
                error=describe(refused),
            )
            return
        self.dead_lettered(parsed.kind)
        log.warning("dead-lettered unreadable event", kind=parsed.kind, error=parsed.error, event_id=event_id)

    def dead_lettered(self, kind: DeadLetterKind) -> None:
        self._metrics.dead_letters.labels(kind).inc()

    def refused(
        self, event: ToolCallEvent, reason: str, *, sender: str | None, answered_shard: int | None
    ) -> None:
        """An event whose sender may not speak for its shard was dead-lettered (``unverified_shard``)."""
        self.dead_lettered(DeadLetterKind.UNVERIFIED_SHARD)
        log.warning(
            "event refused: its sender may not speak for its shard; dead-lettered",
            event_id=str(event.event_id),
            shard_id=event.shard_id,
            sender=sender,
            answered_shard=answered_shard,
            reason=reason,
        )

    def turned_away(self, shard_id: int | None, error: str, *, letter: int | None) -> None:
        """An event its shard's own queue had no room for was turned away: dead-lettered as
        ``shard_backlog_full`` (``letter``: the shard's events turned away without one since its last), or
        only answered (``letter`` None: one line a letter says how many)."""
        if shard_id is not None:
            self._metrics.shard_turned_away(shard_id)
        if letter is None:
            return
        self.dead_lettered(DeadLetterKind.SHARD_BACKLOG_FULL)
        log.warning(
            "shard over its bound: events turned away; one dead letter a minute keeps the record",
            shard_id=shard_id,
            answered_without_letter=letter,
            error=error,
        )


class EventTrace:
    """The telemetry of one readable event, inside its span."""

    __slots__ = ("_event", "_metrics", "_span", "_started", "_topology")

    def __init__(
        self, span: EventSpan, metrics: Metrics, topology: Topology, event: ToolCallEvent, started: float
    ) -> None:
        self._span = span
        self._metrics = metrics
        self._topology = topology
        self._event = event
        self._started = started

    @property
    def traceparent(self) -> str | None:
        """The ``traceparent`` of everything published for the event."""
        return self._span.traceparent

    @contextmanager
    def in_flight(self) -> Iterator[None]:
        """While the event is processed and its outcome published or routed (``ltm_events_in_flight``)."""
        self._metrics.in_flight.inc()
        try:
            yield
        finally:
            self._metrics.in_flight.dec()

    def postgres(self) -> AbstractContextManager[None]:
        """The Postgres step: the event's trip through the batcher."""
        return self._span.step("postgres ltm_save_events", _POSTGRES_STEP, kind="client")

    def processed(self, processed: ProcessedEvent) -> None:
        self._span.set(
            {
                "ltm.status": processed.status,
                "ltm.memory_id": processed.memory_id,
                "ltm.replayed": processed.replayed,
            }
        )

    def publishing(self, work: Awaitable[T], *, notice: bool) -> Coroutine[Any, Any, T]:
        """``work`` (the result and notice publish) inside a producer step."""
        exchange = self._topology.results_exchange
        sent: dict[str, Attribute] = {
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "publish",
            "messaging.destination.name": exchange,
            "ltm.notice": notice,  # the notice goes to tomori.notifications
        }
        return in_step(self._span, f"{exchange} publish", sent, work, kind="producer")

    def invalidating(self, work: Awaitable[T]) -> Coroutine[Any, Any, T]:
        """``work`` (the invalidation, to Redis or the outbox) inside a producer step."""
        channel = self._topology.invalidation_channel
        sent: dict[str, Attribute] = {
            "messaging.system": "redis",
            "messaging.operation.type": "publish",
            "messaging.destination.name": channel,
        }
        return in_step(self._span, f"{channel} publish", sent, work, kind="producer")

    def answered(self, processed: ProcessedEvent) -> None:
        """The event was answered and acked: counted, timed, and its one "event processed" line."""
        metrics = self._metrics
        elapsed = time.monotonic() - self._started
        metrics.observe_answered(self._event.issued_at)
        metrics.events.labels(processed.status).inc()
        metrics.shard_answered(self._event.shard_id)
        metrics.duration.observe(elapsed)
        if processed.replayed:
            metrics.replayed.inc()
        if processed.memory_id is not None:
            log.debug("memory content", content=processed.result.data.get("content_saved"))
        log.info(
            "event processed",
            status=processed.status,
            memory_id=processed.memory_id,
            replayed=processed.replayed,
            duration_ms=round(elapsed * 1000, 1),
        )

    def conflict(self, stored_shard_id: int) -> None:
        """The event's id is in the ledger for a different event. The line names both shards and nothing
        of either event's content."""
        log.warning("event id conflict", stored_shard_id=stored_shard_id)
        self._span.set({"ltm.status": Status.INTERNAL_ERROR, "ltm.event_conflict": True})

    def failed(self, exc: Exception) -> None:
        """The attempt failed with ``exc`` (the span records it)."""
        self._span.fail(exc)

    def routing(self, decision: Retry | DeadLetter, exc: Exception) -> None:
        """A failed attempt is about to be dead-lettered (a retry is reported once parked: :meth:`routed`)."""
        if isinstance(decision, Retry):
            return
        if decision.kind == DeadLetterKind.INTERNAL:
            log.error("internal error; dead-lettered", error=describe(exc), exc_info=exc)
        else:
            log.error("transient fault outlasted every retry; dead-lettered", error=describe(exc))
        self._span.set({"ltm.status": decision.failure.status if decision.failure else None})

    def routed(self, decision: Retry | DeadLetter, error: str) -> None:
        """The delivery was parked in a retry queue or copied to the DLQ, and acked."""
        if isinstance(decision, DeadLetter):
            self._metrics.dead_letters.labels(decision.kind).inc()
            return
        self._metrics.retries.inc()
        log.warning("transient fault; retrying later", error=error, retry_in_ms=decision.delay_ms)
