"""The AMQP headers the worker and ``worker dlq`` write and read, the readers for them, and the one way a
message is copied (retry, dead letter, replay): same body and properties, new headers."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

#: our own headers (CONTRACT.md "Dead letters" plus the retry bookkeeping)
ATTEMPTS = "x-ltm-attempts"
ERROR = "x-ltm-error"
ERROR_KIND = "x-ltm-error-kind"
FAILED_AT = "x-ltm-failed-at"
#: the routing key the shard used, kept while the message travels through the retry queues
ORIGINAL_ROUTING_KEY = "x-ltm-routing-key"
TRACEPARENT = "traceparent"
#: what the worker adds when it dead-letters a message (a replay takes them off again)
DEAD_LETTER_HEADERS = frozenset({ERROR, ERROR_KIND, FAILED_AT, ATTEMPTS})
#: headers ``worker dlq replay`` adds
REPLAYED_AT = "x-ltm-replayed-at"
REPLAY_COUNT = "x-ltm-replay-count"


def header_text(value: Any) -> str | None:
    """A header value as text: AMQP long strings may arrive as bytes; None when it is not a string."""
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return value if isinstance(value, str) else None


def attempts_made(message: AbstractIncomingMessage) -> int:
    """Processing attempts before this delivery (our own ``x-ltm-attempts`` header; 0 when absent)."""
    value = (message.headers or {}).get(ATTEMPTS)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return int(value)
    return 0


def traceparent_of(message: AbstractIncomingMessage) -> str | None:
    """The W3C ``traceparent`` the shard sent, if any."""
    return header_text((message.headers or {}).get(TRACEPARENT)) or None


def original_routing_key(message: AbstractIncomingMessage) -> str:
    """The routing key the shard published with, even after a trip through a retry queue."""
    return header_text((message.headers or {}).get(ORIGINAL_ROUTING_KEY)) or message.routing_key or ""


def rfc3339(moment: datetime) -> str:
    """``2026-12-02T08:00:00.120Z``: the format of ``x-ltm-failed-at`` and ``x-ltm-replayed-at``."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def copy_message(
    message: AbstractIncomingMessage, headers: dict[str, Any], **overrides: Any
) -> aio_pika.Message:
    """The same body and properties with ``headers`` in place of the old ones; ``overrides`` replace
    properties (e.g. ``expiration``). ``user_id`` is dropped: the broker only accepts the publishing
    connection's own user there."""
    properties: dict[str, Any] = {
        "content_type": message.content_type,
        "content_encoding": message.content_encoding,
        "delivery_mode": message.delivery_mode or aio_pika.DeliveryMode.PERSISTENT,
        "priority": message.priority,
        "correlation_id": message.correlation_id,
        "reply_to": message.reply_to,
        "expiration": message.expiration,
        "message_id": message.message_id,
        "timestamp": message.timestamp,
        "type": message.type,
        "user_id": None,
        "app_id": message.app_id,
        **overrides,
    }
    return aio_pika.Message(message.body, headers=headers, **properties)
