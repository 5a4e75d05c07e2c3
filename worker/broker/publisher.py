"""Everything the worker publishes to RabbitMQ: results, notices, retries and dead letters.

Every publish is persistent, ``mandatory`` and awaited until the broker confirms it; an unroutable
message comes back as an error (never a silent drop). Concurrent events await their confirms at the
same time on one channel, so the broker confirms them in batches.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import aio_pika
import orjson
from aio_pika.abc import AbstractExchange, AbstractIncomingMessage

from contracts.models import NOTIFICATION_TYPE, RESULT_TYPE, DeadLetterKind, ToolResult
from worker.faults import TransientError

#: our own headers (CONTRACT.md "Dead letters" plus the retry bookkeeping)
ATTEMPTS = "x-ltm-attempts"
ERROR = "x-ltm-error"
ERROR_KIND = "x-ltm-error-kind"
FAILED_AT = "x-ltm-failed-at"
#: the routing key the shard used, kept while the message travels through the retry queues
ORIGINAL_ROUTING_KEY = "x-ltm-routing-key"
TRACEPARENT = "traceparent"

PUBLISH_TIMEOUT = 10.0


def shard_routing_key(shard_id: int) -> str:
    return f"shard.{shard_id}"


class Publisher:
    """Publishes on one confirm-mode channel's exchanges."""

    def __init__(
        self,
        *,
        results: AbstractExchange,
        notifications: AbstractExchange,
        dead_letter: AbstractExchange,
        default: AbstractExchange,
    ) -> None:
        self._results = results
        self._notifications = notifications
        self._dead_letter = dead_letter
        self._default = default

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
        headers = {TRACEPARENT: traceparent} if traceparent else None
        key = shard_routing_key(shard_id)
        answer = _output(result_body(result), f"result:{event_id}", tool_call_id, RESULT_TYPE, headers)
        publishes = [_confirmed(self._results, answer, key)]
        if notification is not None:
            body = orjson.dumps(notification)
            notice = _output(body, f"notice:{event_id}", tool_call_id, NOTIFICATION_TYPE, headers)
            publishes.append(_confirmed(self._notifications, notice, key))
        await asyncio.gather(*publishes)

    async def dead_letter(
        self, message: AbstractIncomingMessage, *, kind: DeadLetterKind, error: str, attempts: int
    ) -> None:
        """Copy ``message`` to the dead-letter exchange with the ``x-ltm-*`` headers added."""
        headers = {
            **dict(message.headers or {}),
            ERROR: error,
            ERROR_KIND: kind,
            ATTEMPTS: attempts,
            FAILED_AT: datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        }
        await _confirmed(self._dead_letter, _copy(message, headers), original_routing_key(message))

    async def retry_later(
        self, message: AbstractIncomingMessage, *, queue: str, attempts: int, delay_ms: int
    ) -> None:
        """Park ``message`` in a retry queue for ``delay_ms``; it comes back with ``attempts`` recorded."""
        headers = {**dict(message.headers or {}), ATTEMPTS: attempts}
        headers.setdefault(ORIGINAL_ROUTING_KEY, message.routing_key or "")
        await _confirmed(self._default, _copy(message, headers, expiration_ms=delay_ms), queue)


def original_routing_key(message: AbstractIncomingMessage) -> str:
    """The routing key the shard published with, even after a trip through a retry queue."""
    kept = (message.headers or {}).get(ORIGINAL_ROUTING_KEY)
    if isinstance(kept, bytes):
        kept = kept.decode(errors="replace")
    return kept if isinstance(kept, str) and kept else message.routing_key or ""


def result_body(result: ToolResult) -> bytes:
    """A tool result's message body: compact UTF-8 JSON, serialised by pydantic in one pass (the same bytes as
    ``orjson.dumps(result.model_dump(mode="json"))``, a dict fewer)."""
    return result.model_dump_json().encode()


def _output(
    body: bytes, message_id: str, correlation_id: str, kind: str, headers: dict[str, Any] | None
) -> aio_pika.Message:
    return aio_pika.Message(
        body,
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=message_id,
        correlation_id=correlation_id,
        type=kind,
        headers=headers,
    )


def _copy(
    message: AbstractIncomingMessage, headers: dict[str, Any], expiration_ms: int | None = None
) -> aio_pika.Message:
    """The same body and properties, with ``headers`` in place of the old ones."""
    return aio_pika.Message(
        message.body,
        headers=headers,
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        delivery_mode=message.delivery_mode or aio_pika.DeliveryMode.PERSISTENT,
        priority=message.priority,
        correlation_id=message.correlation_id,
        reply_to=message.reply_to,
        expiration=expiration_ms / 1000 if expiration_ms is not None else None,
        message_id=message.message_id,
        timestamp=message.timestamp,
        type=message.type,
        user_id=None,
        app_id=message.app_id,
    )


async def _confirmed(exchange: AbstractExchange, message: aio_pika.Message, routing_key: str) -> None:
    """Publish and wait for the broker's confirm; a nack, a return or a timeout is a transient error."""
    try:
        await exchange.publish(message, routing_key, mandatory=True, timeout=PUBLISH_TIMEOUT)
    except aio_pika.exceptions.DeliveryError as exc:
        raise TransientError(
            f"publish to {exchange.name!r} with key {routing_key!r} was not delivered: {exc}"
        ) from exc
