"""The AMQP headers the worker and ``worker dlq`` write and read, the readers for them, and the one way a
message is copied (retry, dead letter, replay): same body and properties, new headers, always within the
connection's frame size.

The worker's own headers (``x-ltm-*``) steer its bookkeeping (attempts, where a replay goes), so they are
believed only on the worker's own copies: a retry copy comes back to the work queue through the default
exchange, where no shard may publish (deploy/rabbitmq/definitions.json); on every other delivery (a shard's
event, a replay) a shard-set value is ignored and dropped from the copies the worker makes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import aio_pika
import aiormq.abc
from aio_pika.abc import AbstractIncomingMessage
from pamqp import encode

from contracts import names
from worker.broker.content_header import MAX_DEPTH, UNDECODABLE, as_notes, printable, undecodable

#: our own headers (CONTRACT.md "Dead letters" plus the retry bookkeeping; their names: contracts/names.py)
ATTEMPTS = names.ATTEMPTS_HEADER
ERROR = names.ERROR_HEADER
ERROR_KIND = names.ERROR_KIND_HEADER
FAILED_AT = names.FAILED_AT_HEADER
#: the routing key the shard used, kept while the message travels through the retry queues
ORIGINAL_ROUTING_KEY = names.ROUTING_KEY_HEADER
TRACEPARENT = names.TRACEPARENT_HEADER
#: on a ``shard_backlog_full`` letter: how many events of its shard were turned away without a letter since
#: the shard's previous one (a flood keeps one letter a minute: docs/fair-shares.md)
TURNED_AWAY = names.TURNED_AWAY_HEADER
#: the error of an event's first failed attempt, kept on its retry copies and on its dead letter when the last
#: attempt failed otherwise (a database cut during the last retry hides what failed the first four)
FIRST_ERROR = names.FIRST_ERROR_HEADER
#: what the worker adds when it dead-letters a message (a replay takes them off again)
DEAD_LETTER_HEADERS = frozenset({ERROR, ERROR_KIND, FAILED_AT, ATTEMPTS, TURNED_AWAY, FIRST_ERROR})
#: headers ``worker dlq replay`` adds
REPLAYED_AT = names.REPLAYED_AT_HEADER
REPLAY_COUNT = names.REPLAY_COUNT_HEADER
#: what a copy left out of the original: header entries too large for the frame, values that could not be
#: decoded (:mod:`worker.broker.content_header`); a list of one-line notes
DROPPED = names.DROPPED_HEADER
#: the RabbitMQ user that published the event (its AMQP ``user_id``, checked by the broker), recorded on every
#: copy the worker makes, since a copy cannot carry another user's ``user_id``; ``""`` when it had none
USER_ID = names.USER_ID_HEADER
#: the headers only the worker may set: on a delivery that is not the worker's own copy they are ignored
WORKER_ONLY = frozenset(
    {ATTEMPTS, ERROR, ERROR_KIND, FAILED_AT, ORIGINAL_ROUTING_KEY, DROPPED, USER_ID, TURNED_AWAY, FIRST_ERROR}
)
#: what the worker adds to a copy: kept whatever else has to go
_OURS = frozenset(
    {
        ERROR,
        ERROR_KIND,
        FAILED_AT,
        ATTEMPTS,
        ORIGINAL_ROUTING_KEY,
        REPLAYED_AT,
        REPLAY_COUNT,
        TRACEPARENT,
        USER_ID,
        TURNED_AWAY,
        FIRST_ERROR,
    }
)
#: bytes of a content header frame besides the properties: frame header and end (8), class, weight, body
#: size (12)
_HEADER_FRAME_OVERHEAD = 8 + 12
#: how much of a header's name a note quotes
_KEY_LIMIT = 80
#: the most notes a copy carries in ``x-ltm-dropped``
_MAX_DROPPED_NOTES = 20


def header_text(value: Any) -> str | None:
    """A header value as text: AMQP long strings may arrive as bytes; None when it is not a string."""
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return value if isinstance(value, str) else None


def from_worker(message: AbstractIncomingMessage) -> bool:
    """True for the worker's own copies: a retry back from its retry queue and an event moved to its shard's
    own queue both come through the default exchange, which no shard may publish to (the worker's own
    headers, ``x-ltm-user-id`` among them, are believed only on such a delivery)."""
    return message.exchange == ""


def own_headers(message: AbstractIncomingMessage) -> dict[str, Any]:
    """The delivery's headers, without worker-only headers a shard set (kept on the worker's own copies)."""
    headers = dict(message.headers or {})
    if from_worker(message):
        return headers
    return {key: value for key, value in headers.items() if key not in WORKER_ONLY}


@dataclass(frozen=True, slots=True)
class Sender:
    """Who published an event, as far as the broker vouches for it (CONTRACT.md section 2)."""

    #: the RabbitMQ user, or None when the event carried no ``user_id``
    user: str | None
    #: a trusted publisher's own event (no sender recorded on it): it may speak for any shard
    trusted: bool = False

    def recorded(self) -> str:
        """The value of ``x-ltm-user-id`` on a copy of the event (``""``: no ``user_id``)."""
        return self.user or ""


def sender_of(message: AbstractIncomingMessage, trusted: frozenset[str]) -> Sender:
    """The user that published ``message``: its ``user_id``, which RabbitMQ checked against the publishing
    connection. On the worker's own copy (retry, move to a shard's queue) it is the user the worker
    recorded in ``x-ltm-user-id``; on a delivery from a ``trusted`` user (``worker dlq replay``) it is the
    user that publisher recorded, and only a message with no record at all is that user's own event. A
    replay records the dead letter's sender as worker/broker/published_by.py ``published_by`` finds it (the
    worker's record, else the letter's checked ``user_id``, ``""`` for none), never a header a shard wrote."""
    headers = message.headers or {}
    if from_worker(message):
        return Sender(header_text(headers.get(USER_ID)) or None)
    user = message.user_id or None
    if user is not None and user in trusted:
        recorded = header_text(headers.get(USER_ID))
        if recorded is not None:
            return Sender(recorded or None)
        return Sender(user, trusted=True)
    return Sender(user)


def attempts_made(message: AbstractIncomingMessage) -> int:
    """Processing attempts before this delivery (our own ``x-ltm-attempts`` header on a retry copy; 0 on
    any other delivery)."""
    if not from_worker(message):
        return 0
    value = (message.headers or {}).get(ATTEMPTS)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return int(value)
    return 0


def traceparent_of(message: AbstractIncomingMessage) -> str | None:
    """The W3C ``traceparent`` the shard sent, if any."""
    return header_text((message.headers or {}).get(TRACEPARENT)) or None


def original_routing_key(message: AbstractIncomingMessage) -> str:
    """The routing key the shard published with, even after a trip through a retry queue (where the worker
    recorded it)."""
    if from_worker(message):
        kept = header_text((message.headers or {}).get(ORIGINAL_ROUTING_KEY))
        if kept:
            return kept
    return message.routing_key or ""


def rfc3339(moment: datetime) -> str:
    """``2026-12-02T08:00:00.120Z``: the format of ``x-ltm-failed-at`` and ``x-ltm-replayed-at``."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def copy_message(
    message: AbstractIncomingMessage, headers: Mapping[str, Any], *, frame_max: int, **overrides: Any
) -> aio_pika.Message:
    """The same body and properties with ``headers`` in place of the old ones; ``overrides`` replace
    properties (e.g. ``expiration``). ``user_id`` is dropped: the broker only accepts the publishing
    connection's own user there.

    The copy always fits the connection's ``frame_max`` (the content header is one frame): when the original
    headers plus what the worker adds would not, the largest original header entries are dropped and named
    in ``x-ltm-dropped``. What the decoder could not read (:data:`UNDECODABLE`) is carried on as notes in
    ``x-ltm-dropped`` too."""
    headers = dict(headers)
    notes = [*as_notes(headers.pop(DROPPED, None)), *undecodable(headers)]
    headers.pop(UNDECODABLE, None)
    if notes:
        headers[DROPPED] = notes[-_MAX_DROPPED_NOTES:]
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
    copy = aio_pika.Message(message.body, headers=headers, **properties)
    try:
        size = _header_frame_size(copy)
    except Exception:
        # a value the decoder kept that the encoder refuses (a long string that was not UTF-8 comes back as
        # bytes, a timestamp past int64 as an integer, a double past float32's range as a float, which pamqp
        # encodes as 32 bits; a table nested past the recursion limit)
        fixed: list[str] = []
        headers = _encodable(headers, "headers", fixed, 0)
        if fixed:
            headers[DROPPED] = [*as_notes(headers.get(DROPPED)), *fixed][-_MAX_DROPPED_NOTES:]
        copy = aio_pika.Message(message.body, headers=headers, **properties)
        try:
            size = _header_frame_size(copy)
        except Exception as exc:  # what no rule above foresaw: the shard's headers go, the worker's stay
            ours = {k: v for k, v in headers.items() if k in _OURS}
            ours[DROPPED] = [f"headers: could not be copied ({type(exc).__name__})"]
            headers = ours
            copy = aio_pika.Message(message.body, headers=headers, **properties)
            size = _header_frame_size(copy)
    if size <= frame_max:
        return copy
    # The largest original entries go first, so the fewest are lost; a table's size is the sum of its
    # entries', so the size is kept by arithmetic, not by encoding again per entry.
    sizes = {key: _entry_size(key, value) for key, value in headers.items()}
    size -= sizes.pop(DROPPED, 0)
    dropped = as_notes(headers.pop(DROPPED, None))  # the notes so far, those of a fix-up included
    for key in sorted((k for k in sizes if k not in _OURS), key=lambda k: -sizes[k]):
        del headers[key]
        size -= sizes[key]
        dropped.append(f"headers.{printable(key, _KEY_LIMIT)}: {sizes[key]} bytes, dropped to fit the frame")
        note = dropped[-_MAX_DROPPED_NOTES:]
        if size + _entry_size(DROPPED, note) <= frame_max:
            headers[DROPPED] = note
            break
    else:
        # only the worker's own headers are left and still too large (a frame_max of a few KB): the error
        # text is shortened to what fits
        error = header_text(headers.get(ERROR))
        if error is not None and size > frame_max:
            room = max(0, len(error.encode()) - (size - frame_max))
            headers[ERROR] = error.encode()[:room].decode(errors="ignore")
    return aio_pika.Message(message.body, headers=headers, **properties)


def _encodable(table: Mapping[str, Any], where: str, notes: list[str], depth: int) -> dict[str, Any]:
    """``table`` with every value the AMQP encoder takes: bytes become a byte array, an integer past 64 bits
    its decimal text; anything else it cannot take, or nested too deep, is left out and noted."""
    kept: dict[str, Any] = {}
    for key, value in table.items():
        found, fixed = _encodable_value(value, f"{where}.{printable(str(key), _KEY_LIMIT)}", notes, depth)
        if found:
            kept[str(key)] = fixed
    return kept


def _encodable_value(value: Any, where: str, notes: list[str], depth: int) -> tuple[bool, Any]:
    if depth >= MAX_DEPTH:
        notes.append(f"{where}: nested deeper than {MAX_DEPTH} levels")
        return False, None
    if isinstance(value, bytes):
        return True, bytearray(value)
    if isinstance(value, dict):
        return True, _encodable(value, where, notes, depth + 1)
    if isinstance(value, list):
        items = [_encodable_value(item, f"{where}[{n}]", notes, depth + 1) for n, item in enumerate(value)]
        return True, [item for found, item in items if found]
    # a scalar: the encoder decides; a number it refuses (past int64, past float32's range, a Decimal past
    # its exponent) goes as its text
    try:
        encode.encode_table_value(value)
    except (TypeError, ValueError, OverflowError):
        if isinstance(value, int | float | Decimal):
            return True, str(value)
        notes.append(f"{where}: a {type(value).__name__} cannot be copied")
        return False, None
    return True, value


def frame_max_of(channel: aiormq.abc.AbstractChannel) -> int:
    """The frame size the channel's connection negotiated with the broker."""
    return int(channel.connection.connection_tune.frame_max)


def _header_frame_size(message: aio_pika.Message) -> int:
    return _HEADER_FRAME_OVERHEAD + len(message.properties.marshal())


def _entry_size(key: str, value: Any) -> int:
    try:
        return len(encode.field_table({key: value})) - 4
    except (TypeError, ValueError):
        return 0
