"""What a dead letter says about itself (the worker's ``x-ltm-*`` headers or the broker's x-death), and the
key and headers a replay sends: pure, no broker needed. Who published it is :mod:`worker.broker.published_by`,
which ones a command selects :mod:`worker.ops.dlq.selection`."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from aio_pika.abc import AbstractIncomingMessage

from contracts.names import common_routing_key
from worker.broker.headers import (
    ATTEMPTS,
    DEAD_LETTER_HEADERS,
    ERROR,
    ERROR_KIND,
    FAILED_AT,
    FIRST_ERROR,
    ORIGINAL_ROUTING_KEY,
    REPLAY_COUNT,
    REPLAYED_AT,
    header_text,
    rfc3339,
)
from worker.broker.published_by import (
    NOBODY,
    PUBLISHED_BY,
    PublishedBy,
    broker_death,
    published_by,
    workers_copy,
)
from worker.config import Topology

#: broker-owned headers a replayed message must not carry back into the work queue
#: headers the broker changes each time it delivers a message: never part of a letter's key or its kept row
_DELIVERY_HEADERS = frozenset({"x-delivery-count", "x-acquired-count"})
_BROKER_HEADERS = _DELIVERY_HEADERS | {"x-death"}
_BROKER_HEADER_PREFIXES = ("x-first-death-", "x-last-death-")

#: x-death reasons (the broker dead-lettered the message itself) and how they read
_BROKER_REASONS = {
    "delivery_limit": "redelivered more than the delivery limit",
    "rejected": "rejected by a consumer without requeue",
    "expired": "expired (message TTL)",
    "maxlen": "dropped by a queue length limit",
}


# --- reading a dead letter ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Letter:
    """What a dead letter says about itself, from the worker's ``x-ltm-*`` headers or the broker's x-death."""

    event_id: str | None
    kind: str
    error: str
    attempts: int | None
    failed_at: datetime | None
    shard_id: int | None
    #: the key the shard published with: replay sends the message back with it
    routing_key: str
    message_id: str | None = None
    replay_count: int = 0
    #: who published the event (:func:`published_by`)
    published_by: PublishedBy = NOBODY
    #: the error of its first attempt, when the last one failed otherwise (``x-ltm-first-error``)
    first_error: str = ""
    #: the body's ``context.guild_disc_id`` (None: a direct message, or a body that cannot be read)
    guild_id: str | None = None

    @property
    def errors(self) -> str:
        """Its errors, the first attempt's too: what the advice reads a cause from."""
        return f"{self.error} {self.first_error}".strip()

    @property
    def replay_key(self) -> str:
        """Where a replay sends it: its routing key without a per-shard ``.shard.<N>`` suffix, so it always
        reaches the common work queue (``tool.<name>``)."""
        return replay_key(self.routing_key)

    def age(self, now: datetime) -> timedelta | None:
        return None if self.failed_at is None else now - self.failed_at

    def as_json(self) -> dict[str, Any]:
        """The ``worker dlq list --json`` object: exactly the keys of CONTRACT.md."""
        return {
            "event_id": self.event_id,
            "kind": self.kind,
            "error": self.error,
            "attempts": self.attempts,
            "failed_at": None if self.failed_at is None else rfc3339(self.failed_at),
            "shard_id": self.shard_id,
            "routing_key": self.routing_key,
        }


def read_dead_letter(
    message: AbstractIncomingMessage, topology: Topology, trusted: frozenset[str] = frozenset()
) -> Letter:
    """Describe a message taken from the DLQ (``trusted``: LTM_TRUSTED_PUBLISHERS, :func:`published_by`)."""
    return describe_dead_letter(
        message.body,
        dict(message.headers or {}),
        message_id=message.message_id,
        routing_key=message.routing_key or "",
        topology=topology,
        user_id=message.user_id,
        trusted=trusted,
    )


def describe_dead_letter(
    body: bytes,
    headers: Mapping[str, Any],
    *,
    message_id: str | None,
    routing_key: str,
    topology: Topology,
    user_id: str | None = None,
    trusted: frozenset[str] = frozenset(),
) -> Letter:
    """Describe a dead letter from its parts (pure: no broker needed); ``user_id``: its AMQP property."""
    event_id, shard_id, guild_id = _ids_from_body(body)
    if event_id is None:
        event_id = message_id or None
    replay_count = _integer(headers.get(REPLAY_COUNT)) or 0
    sender = published_by(
        headers, user_id=user_id, routing_key=routing_key, topology=topology, trusted=trusted
    )
    kept_key = header_text(headers.get(ORIGINAL_ROUTING_KEY))

    kind = header_text(headers.get(ERROR_KIND))
    # the worker dead-lettered it: its headers say everything; unless the broker put it in the DLQ (then those
    # headers are its publisher's, and x-death says what happened)
    if kind and broker_death(headers, topology) is None:
        return Letter(
            event_id=event_id,
            kind=kind,
            error=header_text(headers.get(ERROR)) or "",
            attempts=_integer(headers.get(ATTEMPTS)),
            failed_at=_timestamp(headers.get(FAILED_AT)),
            shard_id=shard_id,
            routing_key=kept_key or routing_key,
            message_id=message_id,
            replay_count=replay_count,
            published_by=sender,
            first_error=header_text(headers.get(FIRST_ERROR)) or "",
            guild_id=guild_id,
        )

    # the broker dead-lettered it (over the work queue's delivery limit, or a rejection / TTL / length limit)
    death = _death_entry(headers.get("x-death"), topology.work_queue)
    reason = header_text(death.get("reason")) or header_text(headers.get("x-last-death-reason"))
    reason = reason or header_text(headers.get("x-first-death-reason"))
    death_keys = death.get("routing-keys")
    death_key = header_text(death_keys[0]) if isinstance(death_keys, list) and death_keys else None
    if reason:
        error = _BROKER_REASONS.get(reason, f"dead-lettered by the broker ({reason})")
        queue = header_text(death.get("queue"))
        if queue and queue != topology.work_queue:
            error = f"{error} in {queue}"
    else:
        error = "no dead-letter headers (neither x-ltm-* nor x-death)"
    return Letter(
        event_id=event_id,
        kind=reason or "unknown",
        error=error,
        # x-death's count is how often the broker dead-lettered it for this reason; the x-delivery-count
        # a DLQ delivery carries counts redeliveries from the DLQ itself, not attempts, so it is not used
        attempts=_integer(death.get("count")),
        failed_at=_timestamp(death.get("time")),
        shard_id=shard_id,
        # x-ltm-routing-key is the worker's only on its own copy (a retry, a move); on a shard's message the
        # broker's record of its routing key wins
        routing_key=(kept_key if workers_copy(death, routing_key, topology) else None)
        or death_key
        or routing_key,
        message_id=message_id,
        replay_count=replay_count,
        published_by=sender,
        guild_id=guild_id,
    )


def _ids_from_body(body: bytes) -> tuple[str | None, int | None, str | None]:
    """The body's ``event_id``, ``shard_id`` and ``context.guild_disc_id``, each None where unreadable."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None, None, None
    if not isinstance(data, dict):
        return None, None, None
    event_id = data.get("event_id")
    shard_id = data.get("shard_id")
    context = data.get("context")
    guild_id = context.get("guild_disc_id") if isinstance(context, dict) else None
    return (
        event_id if isinstance(event_id, str) and event_id else None,
        shard_id if isinstance(shard_id, int) and not isinstance(shard_id, bool) else None,
        guild_id if isinstance(guild_id, str) and guild_id else None,
    )


def _death_entry(value: Any, work_queue: str) -> Mapping[str, Any]:
    """The x-death entry for the work queue, else the most recent one (the broker keeps newest first)."""
    if not isinstance(value, list):
        return {}
    entries = [entry for entry in value if isinstance(entry, Mapping)]
    for entry in entries:
        if header_text(entry.get("queue")) == work_queue:
            return entry
    return entries[0] if entries else {}


def _integer(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = header_text(value)
    if text is not None and text.strip().lstrip("-").isdigit():
        return int(text)
    return None


def _timestamp(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, UTC)
    text = header_text(value)
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


# --- keeping: a letter's key, and its parts as JSON -----------------------------------------------------


#: the AMQP properties a letter may carry, in the order ``show`` and the page list them
PROPERTY_NAMES = (
    "content_type",
    "content_encoding",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
)


def message_properties(message: object) -> list[tuple[str, Any]]:
    """The AMQP properties a message has set, by name, in the order ``show`` and the page list them."""
    properties = [(name, getattr(message, name, None)) for name in PROPERTY_NAMES]
    return [(name, value) for name, value in properties if value is not None]


def as_dead_lettered(headers: Mapping[str, Any]) -> dict[str, Any]:
    """A letter's headers as the broker dead-lettered it: without the counts each queue's deliveries add."""
    return {name: value for name, value in headers.items() if name not in _DELIVERY_HEADERS}


def letter_key(body: bytes, headers: Mapping[str, Any], message_id: str | None) -> str:
    """What identifies one dead letter in the DLQ and in the table that keeps it: a digest of what the broker
    gave every queue bound to the dead-letter exchange alike (the body, the message id, the headers but the
    broker's count of deliveries, which each queue keeps for itself). A copy delivered twice has one key; the
    same event dead-lettered again (a replay that came back) has another (its replay count, its failure
    time)."""
    kept = as_dead_lettered(headers)
    digest = hashlib.sha256()
    digest.update((message_id or "").encode())
    digest.update(b"\0")
    digest.update(orjson.dumps(json_safe(kept), option=orjson.OPT_SORT_KEYS))
    digest.update(b"\0")
    digest.update(body)
    return digest.hexdigest()


def json_safe(value: Any) -> Any:
    """An AMQP header value as JSON can hold it: times as RFC 3339, bytes as text (undecodable bytes
    replaced), numbers, strings, lists and tables as they are, anything else as its ``str``."""
    if isinstance(value, Mapping):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    if isinstance(value, datetime):
        return rfc3339(value if value.tzinfo else value.replace(tzinfo=UTC))
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


# --- replaying ----------------------------------------------------------------------------------------


def replay_key(routing_key: str) -> str:
    """``tool.<name>.shard.<N>`` as ``tool.<name>``; any other key as it is."""
    return common_routing_key(routing_key)


def replay_headers(headers: Mapping[str, Any], now: datetime, sender: str) -> dict[str, Any]:
    """The headers a replayed message carries: dead-letter and broker bookkeeping gone, replay recorded,
    ``x-ltm-user-id`` the ``sender`` :func:`published_by` found (``""``: none known, which a worker under
    ``LTM_SHARD_IDENTITY=required`` refuses; never the letter's own header, which only the worker's record
    is); the worker's other headers (``x-ltm-routing-key``) and the shard's own kept."""
    kept = {
        key: value
        for key, value in headers.items()
        # the worker's dead-letter headers go too: the attempt count restarts on replay
        if key not in DEAD_LETTER_HEADERS
        and key not in _BROKER_HEADERS
        and not key.startswith(_BROKER_HEADER_PREFIXES)
    }
    kept[PUBLISHED_BY] = sender
    kept[REPLAYED_AT] = rfc3339(now)
    kept[REPLAY_COUNT] = (_integer(headers.get(REPLAY_COUNT)) or 0) + 1
    return kept
