"""Everything the worker publishes to RabbitMQ: results, notices, retries and dead letters.

Every publish is persistent, ``mandatory`` and awaited until the broker confirms it; an unroutable
message comes back as an error (never a silent drop). Concurrent events await their confirms at the
same time on one channel, so the broker confirms them in batches.

Everything goes to aiormq's channel directly (:func:`publish_confirmed`). Results and notices, one or two
per event, are the hot path: their AMQP properties are built once (:func:`json_properties`), the same bytes
on the wire as an aio-pika ``Message`` would give, without its per-message object, lock and property copy.
Retries and dead letters copy a delivery with aio-pika's ``Message`` (:func:`copy_message`) and send its
body and properties.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast
from uuid import UUID

import aio_pika
import aiormq
import orjson
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractIncomingMessage
from pamqp.commands import Basic

from contracts.models import NOTIFICATION_TYPE, RESULT_TYPE, DeadLetterKind, ToolResult
from contracts.names import ShardQueueKind, shard_of_routing_key, shard_queue, shard_routing_key
from worker.aio import side_by_side
from worker.broker.blocking import publish_deadline
from worker.broker.headers import (
    ATTEMPTS,
    ERROR,
    ERROR_KIND,
    FAILED_AT,
    FIRST_ERROR,
    ORIGINAL_ROUTING_KEY,
    TRACEPARENT,
    USER_ID,
    Sender,
    copy_message,
    frame_max_of,
    header_text,
    original_routing_key,
    own_headers,
    rfc3339,
)
from worker.broker.topology import Declared
from worker.config import Topology
from worker.faults import TransientError

PUBLISH_TIMEOUT = 10.0
PERSISTENT = int(aio_pika.DeliveryMode.PERSISTENT)


class BacklogFull(TransientError):
    """The broker refused a publish (a nack): the queue it was routed to is at its bound
    (``x-overflow: reject-publish``)."""


class Publisher:
    """Publishes on one confirm-mode channel's exchanges."""

    def __init__(
        self,
        *,
        channel: AbstractChannel,
        results: AbstractExchange,
        notifications: AbstractExchange,
        dead_letter: AbstractExchange,
        default: AbstractExchange,
    ) -> None:
        self._channel = channel
        self._results = results
        self._notifications = notifications
        self._dead_letter = dead_letter
        self._default = default

    @classmethod
    def for_topology(cls, channel: AbstractChannel, declared: Declared) -> Publisher:
        """A publisher on ``channel`` to the exchanges :func:`declare_topology` declared on it."""
        return cls(
            channel=channel,
            results=declared.results,
            notifications=declared.notifications,
            dead_letter=declared.dead_letter,
            default=channel.default_exchange,
        )

    async def publish_outputs(
        self,
        *,
        event_id: UUID | str,
        tool_call_id: str,
        shard_id: int,
        result: ToolResult,
        notification: Mapping[str, Any] | None,
        traceparent: str | None,
    ) -> None:
        """Publish the result (and the notice, after a save) and wait until both are confirmed."""
        channel = await self._underlay()
        headers = {TRACEPARENT: traceparent} if traceparent else None
        key = shard_routing_key(shard_id)
        answer = json_properties(f"result:{event_id}", tool_call_id, RESULT_TYPE, headers)
        sent = publish_confirmed(channel, self._results.name, key, result_body(result), answer)
        if notification is None:
            await sent
            return
        notice = json_properties(f"notice:{event_id}", tool_call_id, NOTIFICATION_TYPE, headers)
        await side_by_side(
            sent,
            publish_confirmed(channel, self._notifications.name, key, orjson.dumps(notification), notice),
        )

    async def dead_letter(
        self,
        message: AbstractIncomingMessage,
        *,
        kind: DeadLetterKind,
        error: str,
        attempts: int,
        sender: Sender,
        headers: Mapping[str, Any] | None = None,
    ) -> None:
        """Copy ``message`` to the dead-letter exchange with the ``x-ltm-*`` headers added (a shard's own
        ``x-ltm-*`` values are not carried over; ``sender`` is recorded in ``x-ltm-user-id``; ``headers``:
        more of the worker's own)."""
        headers = {
            **own_headers(message),
            **(headers or {}),
            ERROR: error,
            ERROR_KIND: kind,
            ATTEMPTS: attempts,
            FAILED_AT: rfc3339(datetime.now(UTC)),
            USER_ID: sender.recorded(),
        }
        if header_text(headers.get(FIRST_ERROR)) == error:
            del headers[FIRST_ERROR]  # every attempt failed alike: the error says it
        # a dead letter waits in the DLQ for an operator: whatever expiration the event had does not follow it
        channel, key = await self._underlay(), original_routing_key(message)
        copy = copy_message(message, headers, frame_max=frame_max_of(channel), expiration=None)
        await publish_confirmed(channel, self._dead_letter.name, key, copy.body, copy.properties)

    async def retry_later(
        self,
        message: AbstractIncomingMessage,
        *,
        queue: str,
        attempts: int,
        delay_ms: int,
        sender: Sender,
        error: str = "",
    ) -> None:
        """Park ``message`` in a retry queue for ``delay_ms``; it comes back with ``attempts`` and its
        ``sender`` recorded, and the ``error`` of its first failed attempt kept (``x-ltm-first-error``)."""
        headers = {**own_headers(message), ATTEMPTS: attempts, USER_ID: sender.recorded()}
        if error and not header_text(headers.get(FIRST_ERROR)):
            headers[FIRST_ERROR] = error[:MAX_FIRST_ERROR]
        headers[ORIGINAL_ROUTING_KEY] = original_routing_key(message)
        # the per-message expiration is the retry delay: the retry queue dead-letters it back when it ends
        channel = await self._underlay()
        copy = copy_message(message, headers, frame_max=frame_max_of(channel), expiration=delay_ms / 1000)
        await publish_confirmed(channel, self._default.name, queue, copy.body, copy.properties)

    async def move(self, message: AbstractIncomingMessage, *, queue: str, sender: Sender) -> None:
        """Move ``message`` into ``queue`` (a shard's own queue) through the default exchange, as the worker's
        own copy: its attempts, its routing key and its ``sender`` recorded. Raises :class:`BacklogFull` when
        the queue is at its bound, another :class:`TransientError` when the copy is not confirmed."""
        headers = {**own_headers(message), USER_ID: sender.recorded()}
        headers[ORIGINAL_ROUTING_KEY] = original_routing_key(message)
        channel = await self._underlay()
        copy = copy_message(message, headers, frame_max=frame_max_of(channel))
        await publish_confirmed(channel, self._default.name, queue, copy.body, copy.properties)

    async def _underlay(self) -> aiormq.Channel:
        # aio-pika's channels are aiormq.Channel underneath (its abstract type leaves out ``wait``)
        return cast(aiormq.Channel, await self._channel.get_underlay_channel())


def result_body(result: ToolResult) -> bytes:
    """A tool result's message body: compact UTF-8 JSON, serialised by pydantic in one pass (the same bytes as
    ``orjson.dumps(result.model_dump(mode="json"))``, a dict fewer)."""
    return result.model_dump_json().encode()


def json_properties(
    message_id: str | None, correlation_id: str | None, kind: str | None, headers: Mapping[str, Any] | None
) -> Basic.Properties:
    """The AMQP properties of a persistent JSON message with its ids and type: a result or notice
    (CONTRACT.md), or a shard's tool-call event in the simulations."""
    return Basic.Properties(
        content_type="application/json",
        delivery_mode=PERSISTENT,
        message_id=message_id,
        correlation_id=correlation_id,
        message_type=kind,
        headers=dict(headers) if headers else {},
        priority=0,  # aio-pika's Message always sent it: shards have always seen it
    )


#: the AMQP reply code of a mandatory publish no queue was bound for
NO_ROUTE = 312
#: how much of a first attempt's error a retry copy keeps
MAX_FIRST_ERROR = 1000
#: the exchanges of a shard's answers, and the suffix of the shard's queue each is bound to (CONTRACT.md 2)
_ANSWER_EXCHANGES: dict[str, ShardQueueKind] = {
    Topology().results_exchange: "results",
    Topology().notifications_exchange: "notifications",
}


def no_route(exchange: str, routing_key: str) -> str:
    """What a publish the broker returned unroutable means: for a result or a notice, the shard has no queue
    bound for it (a shard declares and binds its queues before it publishes: CONTRACT.md section 2)."""
    shard, kind = shard_of_routing_key(routing_key), _ANSWER_EXCHANGES.get(exchange)
    unbound = f"nothing is bound to {exchange!r} with key {routing_key!r} (NO_ROUTE)"
    if shard is None or kind is None:
        return unbound
    return (
        f"shard {shard} has no queue bound for its {kind}, {shard_queue(shard, kind)} ({unbound}): the "
        "shard must declare and bind it before it publishes (CONTRACT.md section 2)"
    )


async def publish_confirmed(
    channel: aiormq.Channel,
    exchange: str,
    routing_key: str,
    body: bytes,
    properties: Basic.Properties,
) -> None:
    """Publish ``body`` (mandatory) on a confirm-mode aiormq channel and wait for the broker's confirm; a
    nack, a return or a timeout is a transient error. Nothing waits for the frame to leave the socket
    first (``wait=False``): the confirm comes after it.

    The timeout (:data:`PUBLISH_TIMEOUT`) does not run while the broker blocks the connection (a memory or
    disk alarm, :mod:`worker.broker.blocking`), up to ``BLOCKED_PUBLISH_DEADLINE`` in all: a held publish is
    not a failed one, and retrying it would answer the event twice once the alarm clears."""
    try:
        async with publish_deadline(channel.connection, PUBLISH_TIMEOUT):
            await channel.basic_publish(
                body,
                exchange=exchange,
                routing_key=routing_key,
                properties=properties,
                mandatory=True,
                wait=False,
            )
    except aiormq.exceptions.DeliveryError as exc:
        if isinstance(exc.frame, Basic.Nack):
            raise BacklogFull(
                f"RabbitMQ refused the publish to {exchange!r} with key {routing_key!r} (nack)"
            ) from exc
        if isinstance(exc.frame, Basic.Return) and exc.frame.reply_code == NO_ROUTE:
            raise TransientError(no_route(exchange, routing_key)) from exc
        raise TransientError(
            f"publish to {exchange!r} with key {routing_key!r} was not delivered: {exc}"
        ) from exc
