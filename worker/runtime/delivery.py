"""One delivery of the work queue and every way it can be settled: acked, parked in a retry queue,
dead-lettered (its shard answered when it can be), or handed back to the queue.

:mod:`worker.service.policy` decides which. This module carries it out. Only a lost channel leaves a
delivery to the broker, which requeues it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol
from uuid import UUID

import aio_pika.exceptions
import structlog
from aio_pika.abc import AbstractIncomingMessage

from contracts.models import DeadLetterKind, ToolResult
from worker.broker.acks import Acks
from worker.broker.envelope import RoutableIds
from worker.broker.headers import Sender
from worker.pipeline.outcome import Outcome
from worker.redact import describe
from worker.service.policy import DeadLetter, Retry

log = structlog.get_logger("worker")

#: pause before a delivery the worker could not route is handed back (no hot loop through the broker)
UNSETTLED_REQUEUE_SECONDS = 1.0


class Outputs(Protocol):
    """Publishes an event's answer and copies a failed delivery, each confirmed by the broker
    (:class:`worker.broker.publisher.Publisher`)."""

    async def publish_outputs(
        self,
        *,
        event_id: UUID | str,
        tool_call_id: str,
        shard_id: int,
        result: ToolResult,
        notification: Mapping[str, Any] | None,
        traceparent: str | None,
    ) -> None: ...

    async def retry_later(
        self,
        message: AbstractIncomingMessage,
        *,
        queue: str,
        attempts: int,
        delay_ms: int,
        sender: Sender,
        error: str = "",
    ) -> None: ...

    async def dead_letter(
        self,
        message: AbstractIncomingMessage,
        *,
        kind: DeadLetterKind,
        error: str,
        attempts: int,
        sender: Sender,
        headers: Mapping[str, Any] | None = None,
    ) -> None: ...


class Delivery:
    """A delivery, settled through its channel's :class:`~worker.broker.acks.Acks` and copied by
    ``publisher``; ``sender`` (who published it) is recorded on every copy."""

    __slots__ = ("_acks", "_publisher", "message", "sender")

    def __init__(
        self, message: AbstractIncomingMessage, acks: Acks, publisher: Outputs, sender: Sender | None = None
    ) -> None:
        self.message = message
        self._acks = acks
        self._publisher = publisher
        self.sender = sender if sender is not None else Sender(message.user_id or None)

    @property
    def channel_closed(self) -> bool:
        """True when the delivery's channel is gone (its connection lost): the broker requeues it then."""
        try:
            return bool(self.message.channel.is_closed)
        except aio_pika.exceptions.ChannelInvalidStateError:  # aio-pika's way of saying "closed"
            return True

    async def ack(self) -> bool:
        """Ack the delivery (with the acks of its turn: :class:`worker.broker.acks.Acks`); False when its
        channel is gone (the broker then redelivers it)."""
        try:
            await self._acks.ack(self.message)
        except Exception as exc:
            log.warning(
                "ack failed; the broker redelivers the event",
                message_id=self.message.message_id,
                error=describe(exc),
            )
            return False
        return True

    async def retry(self, decision: Retry, queue: str, error: str = "") -> None:
        """Park a copy in the retry queue ``queue`` (confirmed), then ack; ``error``, why this attempt failed,
        is kept on the copy if it is the first. Raises when the broker refuses the copy: nothing is acked
        then."""
        await self._publisher.retry_later(
            self.message,
            queue=queue,
            attempts=decision.attempts,
            delay_ms=decision.delay_ms,
            sender=self.sender,
            error=error,
        )
        await self.ack()

    async def dead_letter(
        self,
        decision: DeadLetter,
        error: str,
        ids: RoutableIds | None,
        *,
        traceparent: str | None,
        headers: Mapping[str, Any] | None = None,
    ) -> None:
        """DLQ copy first (confirmed), then the failure result for a waiting shard, then the ack. Raises
        when the broker refuses the DLQ copy: nothing is acked then.

        Once the DLQ copy is confirmed the delivery is acked whatever becomes of the failure result: the
        dead letter is the record (a replay answers the shard), and an unacked delivery would come back
        and be dead-lettered again. The DLQ copy keeps the event's own headers; the failure result carries
        ``traceparent``; ``headers``: more of the worker's own on the DLQ copy."""
        kind = decision.kind
        await self._publisher.dead_letter(
            self.message,
            kind=kind,
            error=error,
            attempts=decision.attempts,
            sender=self.sender,
            headers=headers,
        )
        if ids is not None and decision.failure is not None:
            try:
                await self._answer(decision.failure, ids, traceparent)
            except Exception as exc:
                log.warning(
                    "failure result not delivered; the dead letter keeps the event",
                    event_id=str(ids.event_id),
                    shard_id=ids.shard_id,
                    kind=kind,
                    error=describe(exc),
                )
        await self.ack()

    async def answer_unkept(
        self, decision: DeadLetter, ids: RoutableIds | None, *, traceparent: str | None
    ) -> bool:
        """Answer the waiting shard with the decision's failure result (confirmed), then ack, keeping no dead
        letter; False, with nothing acked, when there is no answer to give or the broker did not take it
        (the caller keeps a dead letter instead: no event goes without a record or an answer)."""
        if ids is None or decision.failure is None:
            return False
        try:
            await self._answer(decision.failure, ids, traceparent)
        except Exception as exc:
            log.warning("failure result not delivered; a dead letter keeps the event", error=describe(exc))
            return False
        await self.ack()
        return True

    async def _answer(self, failure: Outcome, ids: RoutableIds, traceparent: str | None) -> None:
        """The failure result for the waiting shard, confirmed (raises when the broker does not take it)."""
        await self._publisher.publish_outputs(
            event_id=ids.event_id,
            tool_call_id=ids.tool_call_id,
            shard_id=ids.shard_id,
            result=failure.result(ids, datetime.now(UTC)),
            notification=None,
            traceparent=traceparent,
        )

    async def hand_back(self, stopping: asyncio.Event) -> None:
        """Every delivery ends settled: one the handler could neither ack nor route (the broker refused a
        retry or dead-letter copy) is handed back after a pause, so it does not hold a prefetch slot until
        the connection closes. Each hand-back counts toward the work queue's delivery limit, so a delivery
        that can never be routed reaches the DLQ through the broker, never loops for ever.

        Nothing is done for a delivery already settled, or whose channel is gone (the broker requeues it).
        The pause ends early when the worker starts ``stopping``."""
        message = self.message
        if self._acks.settled(message) or self.channel_closed:
            return
        log.warning(
            "delivery not settled; handing it back to the queue",
            message_id=message.message_id,
            delivery_tag=message.delivery_tag,
            retry_in_s=UNSETTLED_REQUEUE_SECONDS,
        )
        if not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), timeout=UNSETTLED_REQUEUE_SECONDS)
        try:
            await self._acks.nack(message, requeue=True)
        except Exception as exc:
            log.warning("could not hand a delivery back; the broker requeues it", error=describe(exc))
