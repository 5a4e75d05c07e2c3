"""Who published a dead letter's event (:func:`published_by`), as far as anything the worker or RabbitMQ
vouches for says: the one rule behind a replay's ``x-ltm-user-id``, ``worker dlq show`` and the page. Pure,
no broker needed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contracts.names import USER_ID_HEADER, shard_of_work_queue
from worker.broker.headers import ERROR_KIND, header_text
from worker.config import Topology

#: the RabbitMQ user that published the event, as the worker recorded it on the letter (the worker's own
#: header, like ``x-ltm-attempts``); a replay carries the sender :func:`published_by` finds, so the worker
#: checks the same identity again
PUBLISHED_BY = USER_ID_HEADER

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
