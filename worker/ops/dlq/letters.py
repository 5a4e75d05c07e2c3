"""What a dead letter says about itself (the worker's ``x-ltm-*`` headers or the broker's x-death),
which ones a command selects, and the headers a replay sends: pure, no broker needed."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from aio_pika.abc import AbstractIncomingMessage

from contracts.names import USER_ID_HEADER, common_routing_key, shard_of_work_queue
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
from worker.config import Topology

#: the RabbitMQ user that published the event, as the worker recorded it on the letter (the worker's own
#: header, like ``x-ltm-attempts``); a replay carries the sender :func:`published_by` finds, so the worker
#: checks the same identity again
PUBLISHED_BY = USER_ID_HEADER

#: broker-owned headers a replayed message must not carry back into the work queue
_BROKER_HEADERS = frozenset({"x-death", "x-delivery-count", "x-acquired-count"})
_BROKER_HEADER_PREFIXES = ("x-first-death-", "x-last-death-")

#: x-death reasons (the broker dead-lettered the message itself) and how they read
_BROKER_REASONS = {
    "delivery_limit": "redelivered more than the delivery limit",
    "rejected": "rejected by a consumer without requeue",
    "expired": "expired (message TTL)",
    "maxlen": "dropped by a queue length limit",
}


# --- who published a dead letter ----------------------------------------------------------------------

#: where :func:`published_by` found a letter's sender
RECORDED_BY_WORKER = "worker"
RECORDED_BY_TRUSTED = "trusted_publisher"
USER_ID_PROPERTY = "user_id"
UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class PublishedBy:
    """Who published a dead letter's event, as far as anything the worker or RabbitMQ vouches for says."""

    #: the RabbitMQ user, or None: none known (the event had no ``user_id``, or nothing vouches for a record)
    user: str | None
    #: where it was found: :data:`RECORDED_BY_WORKER`, :data:`RECORDED_BY_TRUSTED`, :data:`USER_ID_PROPERTY`
    #: or :data:`UNKNOWN`
    source: str
    #: how ``show`` and the page say it, after the user
    how: str

    def recorded(self) -> str:
        """The ``x-ltm-user-id`` a replay of the letter carries (``""``: no sender known)."""
        return self.user or ""

    def describe(self) -> str:
        """``shard-0 (the message's user_id, checked by RabbitMQ)``: the user (or none), how it is known."""
        if self.user is not None:
            return f"{self.user} ({self.how})"
        return f"{'none' if self.source != UNKNOWN else 'unknown'} ({self.how})"


#: a letter no part of which says who published it
NOBODY = PublishedBy(None, UNKNOWN, "no user_id")


def published_by(
    headers: Mapping[str, Any],
    *,
    user_id: str | None,
    routing_key: str,
    topology: Topology,
    trusted: frozenset[str] = frozenset(),
) -> PublishedBy:
    """Who published a dead letter's event: the one rule behind ``worker dlq replay``'s ``x-ltm-user-id``,
    ``worker dlq show`` and the page (CONTRACT.md section 7, "Who published a dead letter").

    ``x-ltm-user-id`` is believed only where the worker wrote it, since on any other message it is whatever
    its publisher put there (security review 5, N-C: a shard's forged header, dead-lettered by the broker,
    came back as that shard's word):

    1. a dead letter the worker made: it carries ``x-ltm-error-kind`` and no broker dead-lettering from the
       work queue or a shard's queue is on top of it (the newest ``x-death`` entry, if any, names neither;
       the worker copies a retry's x-death, which names a retry queue);
    2. the worker's own copy (a retry, a move to a shard's queue) that the broker dead-lettered from the work
       queue or a shard's queue: the newest ``x-death`` entry's ``exchange`` is ``""`` (the default exchange)
       **and** the letter's routing key is the name of the work queue or of a shard's queue. Only the worker
       may publish to the default exchange (deploy/rabbitmq/definitions.json), and only the default exchange
       and the retry queues' dead-lettering (into the work queue, by its name) give a message such a key; a
       publisher can write an ``x-death`` header of its own, and RabbitMQ keeps its ``exchange`` when it
       dead-letters the message for the same queue and reason (seen on 3.10; 3.12 and 3.13.3+ read a
       client's ``x-death`` too), but never the routing key, which the broker routes by.

    Otherwise the broker dead-lettered a message as its publisher sent it, and the sender is its AMQP
    ``user_id``, which RabbitMQ checked against the publishing connection, except that a ``trusted``
    publisher's message (``worker dlq replay``'s, LTM_TRUSTED_PUBLISHERS) is that publisher's word as the
    worker takes it (headers.py ``sender_of``): the ``x-ltm-user-id`` it recorded, or, with none, its own
    event. No ``user_id``: no sender known. A letter whose newest ``x-death`` a shard forged to name the
    work queue is read by rule 2, and its sender is then unknown: the shard only loses its own record."""
    recorded = header_text(headers.get(PUBLISHED_BY))
    death = broker_death(headers, topology)
    if death is None:
        worker_made = bool(header_text(headers.get(ERROR_KIND)))
    else:
        worker_made = workers_copy(death, routing_key, topology)
    if worker_made:
        if recorded:
            return PublishedBy(recorded, RECORDED_BY_WORKER, "recorded by the worker")
        return PublishedBy(None, RECORDED_BY_WORKER, "no user_id, recorded by the worker")
    user = user_id or None
    if user is not None and user in trusted:
        if recorded is None:
            own = "the message's user_id, checked by RabbitMQ: a trusted publisher's own event"
            return PublishedBy(user, RECORDED_BY_TRUSTED, own)
        if recorded:
            how = f"recorded by {user}, a trusted publisher (whose user_id RabbitMQ checked)"
            return PublishedBy(recorded, RECORDED_BY_TRUSTED, how)
        how = f"{user}, a trusted publisher, recorded no user_id for the event"
        return PublishedBy(None, RECORDED_BY_TRUSTED, how)
    ignored = f"; its x-ltm-user-id {recorded!r} is not known to be the worker's, ignored" if recorded else ""
    if user is not None:
        return PublishedBy(user, USER_ID_PROPERTY, f"the message's user_id, checked by RabbitMQ{ignored}")
    return PublishedBy(None, UNKNOWN, f"no user_id{ignored}")


def broker_death(headers: Mapping[str, Any], topology: Topology) -> Mapping[str, Any] | None:
    """The x-death entry of the broker's dead-lettering into the DLQ, or None when the broker did not put the
    letter there (the worker published it). The newest entry is the broker's own: it adds one per queue and
    reason, or moves the one it updates to the front, so its ``queue`` and ``reason`` are what happened even
    under a publisher's forged x-death. Only the work queue and the shards' own queues dead-letter into the
    DLQ; a copy the worker dead-lettered keeps an older x-death (a retry queue's), never one of theirs."""
    value = headers.get("x-death")
    newest = (
        next((entry for entry in value if isinstance(entry, Mapping)), None)
        if isinstance(value, list)
        else None
    )
    if newest is None:
        return None
    queue = header_text(newest.get("queue")) or ""
    return newest if queue == topology.work_queue or _is_shard_queue(queue, topology) else None


def workers_copy(death: Mapping[str, Any], routing_key: str, topology: Topology) -> bool:
    """Whether the message the broker dead-lettered (``death``: :func:`broker_death`) was the worker's own
    copy, a retry or a move: published through the default exchange (the entry's ``exchange`` is ``""``)
    and routed by a queue's name, the work queue's (a retry queue dead-letters back into it by its name) or a
    shard queue's (a move). ``routing_key`` is the letter's own, which the broker routed by (a publisher's
    x-death can say anything, its routing key not)."""
    return header_text(death.get("exchange")) == "" and (
        routing_key == topology.work_queue or _is_shard_queue(routing_key, topology)
    )


def _is_shard_queue(name: str, topology: Topology) -> bool:
    """``ltm.create_memory.shard.<N>``: a shard's own queue."""
    return shard_of_work_queue(name, topology.shard_queue_prefix) is not None


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
    event_id, shard_id = _ids_from_body(body)
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
    )


def _ids_from_body(body: bytes) -> tuple[str | None, int | None]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None, None
    if not isinstance(data, dict):
        return None, None
    event_id = data.get("event_id")
    shard_id = data.get("shard_id")
    return (
        event_id if isinstance(event_id, str) and event_id else None,
        shard_id if isinstance(shard_id, int) and not isinstance(shard_id, bool) else None,
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


# --- choosing dead letters ----------------------------------------------------------------------------

_DURATION_PART = re.compile(r"(\d+)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """``30s``, ``10m``, ``2h``, ``1d``, ``1w`` or a sum such as ``1h30m``; ValueError otherwise."""
    compact = text.strip().lower()
    parts = _DURATION_PART.findall(compact)
    if not parts or "".join(n + unit for n, unit in parts) != compact:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 10m, 2h, 1d or 1h30m)")
    return timedelta(seconds=sum(int(n) * _UNIT_SECONDS[unit] for n, unit in parts))


# --- groups ------------------------------------------------------------------------------------------

#: what ``--group-by`` and ``--group`` take: a letter's kind, its error normalised, the shard it names
GROUP_FIELDS = ("kind", "error", "shard")
#: the shard group of a dead letter whose body names no shard (not JSON, or no integer ``shard_id``)
NO_SHARD = "none"

_UUID = re.compile(r"\b[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}\b")
_HEX_ID = re.compile(r"\b(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b")
#: a number standing alone as a word: not part of a name (``UTF-8``, ``sha256``, ``8-4-4-4-12``, ``v1.2``);
#: a sign, a decimal or dotted part (``127.0.0.1``) and a unit (``30.5s``, ``64KiB``, ``5ms``) go with it
_NUMBER = re.compile(
    r"(?<![\w.+-])(?P<number>[-+]?[0-9]+(?:\.[0-9]+)*)(?P<unit>ms|s|m|h|d|B|KiB|MiB|GiB|KB|MB|GB|%)?(?![\w-])"
)
#: the project's own fixed sentences name their bounds after these words (``at most 100``, ``over the 262144
#: byte limit``, ``nested deeper than 1024 levels``): such a number is the rule, not the case, and stays
_BOUND_BEFORE = (
    "at most ",
    "at least ",
    "more than ",
    "less than ",
    "over the ",
    "over ",
    "deeper than ",
    "equal to ",
    "U+",
)
_SPACES = re.compile(r"\s+")
#: an error group's text is at most this long (the rest of a longer error is detail, not class)
MAX_ERROR_GROUP = 200


def normalise_error(error: str) -> str:
    """The error's class: ids (UUIDs, long hex) become ``<id>``, numbers that stand alone ``<n>`` (a bound the
    sentence states stays), blanks one space, so ``unknown schema_version 2`` and ``unknown schema_version 7``
    are one group while ``not UTF-8 JSON`` reads as it was written."""
    text = _UUID.sub("<id>", error)
    text = _HEX_ID.sub("<id>", text)
    text = _NUMBER.sub(_number_class, text)
    text = _SPACES.sub(" ", text).strip()
    return text[:MAX_ERROR_GROUP] if text else "-"


def _number_class(match: re.Match[str]) -> str:
    if match.string[: match.start()].endswith(_BOUND_BEFORE):
        return match.group()
    return "<n>" + (match.group("unit") or "")


def group_value(letter: Letter, field: str) -> str:
    """The group ``letter`` falls in when grouped by ``field`` (one of :data:`GROUP_FIELDS`)."""
    if field == "kind":
        return letter.kind
    if field == "error":
        return normalise_error(letter.error)
    if field == "shard":
        return NO_SHARD if letter.shard_id is None else str(letter.shard_id)
    raise ValueError(f"cannot group by {field!r} (use {', '.join(GROUP_FIELDS)})")


def parse_group(text: str) -> tuple[str, str]:
    """``kind=schema``, ``shard=3``, ``error=unknown schema_version <n>`` as (field, value); ValueError
    otherwise."""
    field, sep, value = text.partition("=")
    field = field.strip()
    if not sep or field not in GROUP_FIELDS:
        raise ValueError(
            f"not a group: {text!r} (use FIELD=VALUE with FIELD one of {', '.join(GROUP_FIELDS)}, as "
            "`worker dlq list --group-by FIELD` prints it)"
        )
    return field, value


@dataclass(frozen=True, slots=True)
class Selection:
    """Which dead letters a command acts on; empty means all. Filters combine with AND, values with OR."""

    kinds: frozenset[str] = frozenset()
    event_ids: frozenset[str] = frozenset()
    #: only dead letters that failed at least this long ago (unknown failure time: never selected)
    older_than: timedelta | None = None
    #: only the dead letters in these groups, (field, value) as :func:`parse_group` reads them; several
    #: groups of one field are OR-ed, of different fields AND-ed, like the other filters
    groups: frozenset[tuple[str, str]] = frozenset()

    def matches(self, letter: Letter, now: datetime) -> bool:
        if self.kinds and letter.kind not in self.kinds:
            return False
        if self.groups and not self._in_groups(letter):
            return False
        # the event id the body names (the message_id only stands in for a body without one)
        if self.event_ids and letter.event_id not in self.event_ids:
            return False
        if self.older_than is not None:
            age = letter.age(now)
            if age is None or age < self.older_than:
                return False
        return True

    def _in_groups(self, letter: Letter) -> bool:
        fields = {field for field, _ in self.groups}
        return all(
            group_value(letter, field) in {value for f, value in self.groups if f == field}
            for field in fields
        )

    def describe(self) -> dict[str, object]:
        """The filters as the audit records them (JSON-ready; empty ones left out)."""
        filters: dict[str, object] = {}
        if self.kinds:
            filters["kind"] = sorted(self.kinds)
        if self.event_ids:
            filters["event_id"] = sorted(self.event_ids)
        if self.older_than is not None:
            filters["older_than_seconds"] = int(self.older_than.total_seconds())
        if self.groups:
            filters["group"] = [f"{field}={value}" for field, value in sorted(self.groups)]
        return filters


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
