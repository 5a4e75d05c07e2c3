"""``worker dlq replay``: republish the selected dead letters to the work exchange, at a pace, each with the
sender it is known by (:class:`Senders`), on record as it goes (:class:`Watched`)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Protocol
from urllib.parse import unquote, urlsplit

import aio_pika
import aiormq.exceptions
from aio_pika.abc import AbstractExchange, AbstractIncomingMessage

from worker.aio import close_quietly
from worker.broker.dead_letters import Letter, replay_headers
from worker.broker.headers import copy_message, frame_max_of
from worker.ops.dlq.audit import Taken
from worker.ops.dlq.operations import Journal, ProgressFn, StopFn, Totals, stop_here, taken
from worker.ops.dlq.selection import Selection
from worker.ops.dlq.sweep import DEFAULT_BATCH, DeadLetterQueue, Found, Sweep
from worker.redact import describe

PUBLISH_TIMEOUT = 30.0


class Watched(Journal, Protocol):
    """What a replay on record also does (:class:`worker.ops.dlq.audit.Operation`): it says how far it got,
    learns whether someone asked it to stop, and asks which letters an earlier replay already sent."""

    def note(self, expected: int, scanned: int, selected: int, moved: int) -> None: ...

    def stopping(self) -> str | None: ...

    async def sent_before(self, letters: Sequence[Taken]) -> dict[int, str]: ...


#: letters per second ``worker dlq replay`` sends unless ``--rate`` says otherwise: one worker on the
#: project's two-core test machine answers 330 to 470 events a second, so 50 a second takes at most about a
#: sixth of one worker beside the shards' live traffic, and 3,000 letters (an hour of a failing dependency)
#: take a minute
DEFAULT_RATE = 50.0
#: how often a rated replay sends: a tenth of its rate each time, so the work queue never sees a second's
#: worth at once
PACE_STEP = 0.1


class Pace:
    """At most ``rate`` letters a second over the replay, counted from its first send: :meth:`take` waits
    until ``n`` more may go, asking ``stop`` every tenth of a second while it waits."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self._clock = clock
        self._next: float | None = None

    def batch(self, batch: int) -> int:
        """How many letters a round takes: a :data:`PACE_STEP` of the rate, at most ``batch``."""
        return max(1, min(batch, math.ceil(self.rate * PACE_STEP)))

    async def take(self, n: int, stop: Callable[[], bool]) -> bool:
        """Wait until ``n`` letters may go; False (nothing taken) when ``stop()`` became true meanwhile."""
        start = self._clock() if self._next is None else self._next
        while (left := start - self._clock()) > 0:
            if stop():
                return False
            await asyncio.sleep(min(left, PACE_STEP))
        # a replay that fell behind (a slow broker) does not catch up in a burst: it goes on at the rate
        self._next = max(start, self._clock() - PACE_STEP) + n / self.rate
        return True


@dataclass(frozen=True, slots=True)
class Senders:
    """What a replay does with a letter whose sender is unknown (``worker.broker.published_by``: the worker
    recorded none, or the broker dead-lettered an event that had no ``user_id``)."""

    #: leave it in the DLQ, on record as ``not_replayed`` (``LTM_SHARD_IDENTITY=required``: the worker would
    #: refuse it as ``unverified_shard``)
    refuse_unknown: bool = False
    #: ``--as-trusted-publisher``: send it as the replaying user's own event (``x-ltm-user-id`` that user, a
    #: trusted publisher, which the worker lets speak for any shard); the operator vouches for it
    as_trusted_publisher: bool = False

    def refusal(self, letter: Letter) -> str | None:
        """Why ``letter`` is not replayed, or None."""
        if letter.published_by.user is not None or not self.refuse_unknown or self.as_trusted_publisher:
            return None
        return (
            f"no known sender ({letter.published_by.describe()}): under LTM_SHARD_IDENTITY=required the "
            "worker would refuse it; --as-trusted-publisher replays it as your own event"
        )

    def sender(self, letter: Letter, user: str) -> str:
        """The ``x-ltm-user-id`` the replay of ``letter`` carries, ``user`` replaying it."""
        if letter.published_by.user is None and self.as_trusted_publisher:
            return user
        return letter.published_by.recorded()


#: every letter replayed with the sender it has, none known included (``LTM_SHARD_IDENTITY`` checked, shared)
AS_RECORDED = Senders()


async def replay(
    dlq: DeadLetterQueue,
    selection: Selection = Selection(),
    *,
    batch: int = DEFAULT_BATCH,
    limit: int | None = None,
    dry_run: bool = False,
    on_found: Callable[[Found, datetime], None] | None = None,
    progress: ProgressFn | None = None,
    journal: Watched | None = None,
    stop: StopFn | None = None,
    senders: Senders = AS_RECORDED,
    pace: Pace | None = None,
) -> Totals:
    """Republish the selected dead letters to the work exchange; ack each DLQ copy once confirmed.

    Each goes back to ``tomori.tool_calls`` with its original routing key, body and properties (confirms +
    mandatory); a crash between the confirm and the ack leaves the event in both queues, which the worker's
    idempotency makes harmless and the next replay finishes (:mod:`worker.ops.dlq.doubt`: a letter an earlier
    replay sent is removed, ``replayed_before``, not sent again). Each carries its sender as ``published_by``
    found it (``senders`` says what becomes of one with none known: a letter it refuses stays, on record as
    ``not_replayed``). ``pace``: at most its rate, a tenth of a second's worth a round. ``stop`` (Ctrl-C) and
    the journal's ``stopping`` (``worker dlq cancel``) are asked between rounds and while the pace waits: a
    round begun is settled first, so a letter is either replayed or still in the DLQ, never both."""
    publish_channel = None if dry_run else await dlq.work_exchange()
    if pace is not None and not dry_run:
        batch = pace.batch(batch)
    try:
        exchange = (
            None
            if publish_channel is None
            else await publish_channel.get_exchange(dlq.topology.tool_calls_exchange, ensure=False)
        )
        failures: list[tuple[str | None, str]] = []
        before = 0
        cancelled_by: str | None = None

        def cancelled() -> bool:
            nonlocal cancelled_by
            if journal is not None and cancelled_by is None:
                cancelled_by = journal.stopping()
            return cancelled_by is not None

        def halt() -> bool:
            return cancelled() or (stop is not None and stop())

        async with await dlq.sweep(selection, batch=batch, limit=limit) as sweep:
            while True:
                stop_here(stop)
                if cancelled():
                    break
                found = await sweep.next_batch()
                if found is None:
                    break
                stop_here(stop)  # the batch is held, nothing of it moved yet
                if on_found is not None:
                    for item in found:
                        on_found(item, sweep.now)
                if exchange is not None and found:
                    assert publish_channel is not None
                    if journal is not None:
                        found, removed = await _sent_before(sweep, found, journal)
                        before += removed
                    if pace is not None and found and not await pace.take(len(found), halt):
                        stop_here(stop)
                        break  # cancelled while waiting: this round goes back with the rest
                    frame_max = frame_max_of(await publish_channel.get_underlay_channel())
                    if journal is not None and found:
                        await journal.taking(taken(found))
                    kept = [
                        (item, why) for item in found if (why := senders.refusal(item.letter)) is not None
                    ]
                    going = [item for item in found if senders.refusal(item.letter) is None]
                    confirmed, refused = await _republish(
                        exchange, going, frame_max, user_of(dlq.url), senders
                    )
                    refused += kept
                    failures.extend((item.letter.event_id, why) for item, why in refused)
                    if journal is not None:
                        # before the acks: a letter acked is always on record as replayed
                        await journal.settled(taken(confirmed), "replayed")
                        await journal.settled(
                            taken([item for item, _ in refused]),
                            "not_replayed",
                            {item.message.delivery_tag or 0: why for item, why in refused},
                        )
                    await sweep.remove(confirmed)
                    if publish_channel is not None and publish_channel.is_closed:
                        failures.append((None, "the publishing channel closed; replay stopped"))
                        break
                if journal is not None:
                    journal.note(sweep.expected, sweep.scanned, sweep.selected, sweep.removed)
                if progress is not None:
                    progress(sweep)
            return replace(
                Totals.of(sweep), failures=failures, replayed_before=before, cancelled_by=cancelled_by
            )
    finally:
        if publish_channel is not None:
            await close_quietly(publish_channel)


async def _sent_before(sweep: Sweep[Found], found: list[Found], journal: Watched) -> tuple[list[Found], int]:
    """Remove the letters an earlier replay already sent (on record as ``replayed_before``, with how that is
    known); the others, to send, and how many were removed."""
    sent = await journal.sent_before(taken(found))
    if not sent:
        return found, 0
    done = [item for item in found if item.message.delivery_tag in sent]
    await journal.taking(taken(done))
    await journal.settled(taken(done), "replayed_before", sent)
    await sweep.remove(done)
    return [item for item in found if item.message.delivery_tag not in sent], len(done)


async def _republish(
    exchange: AbstractExchange, found: Sequence[Found], frame_max: int, user: str, senders: Senders
) -> tuple[list[Found], list[tuple[Found, str]]]:
    """Publish every one at once and wait for the confirms; the ones the broker confirmed, and the others
    with why."""
    now = datetime.now(UTC)
    results = await asyncio.gather(
        *(
            exchange.publish(
                replay_message(item.message, now, frame_max, user, senders.sender(item.letter, user)),
                item.letter.replay_key,
                mandatory=True,
                timeout=PUBLISH_TIMEOUT,
            )
            for item in found
        ),
        return_exceptions=True,
    )
    confirmed: list[Found] = []
    refused: list[tuple[Found, str]] = []
    for item, result in zip(found, results, strict=True):
        if isinstance(result, BaseException):
            if not isinstance(result, Exception):  # CancelledError, KeyboardInterrupt: not ours to eat
                raise result
            refused.append((item, _publish_failure(result, item.letter)))
        else:
            confirmed.append(item)
    return confirmed, refused


def _publish_failure(exc: Exception, letter: Letter) -> str:
    if isinstance(exc, aiormq.exceptions.PublishError):
        return f"routing key {letter.replay_key!r} is not bound to any queue (returned unroutable)"
    if isinstance(exc, aiormq.exceptions.DeliveryError):
        return "the broker refused the message (nack)"
    if isinstance(exc, TimeoutError):
        return f"no confirm within {PUBLISH_TIMEOUT:g}s"
    return describe(exc)


def replay_message(
    message: AbstractIncomingMessage, now: datetime, frame_max: int, user: str, sender: str
) -> aio_pika.Message:
    """The original body and properties with the replay headers (``x-ltm-user-id``: ``sender``), within the
    frame, published as ``user`` (AMQP ``user_id``: the broker accepts only the publishing connection's own
    user there, and a worker takes a trusted publisher's replay as the sender it records)."""
    headers = replay_headers(dict(message.headers or {}), now, sender)
    return copy_message(message, headers, frame_max=frame_max, user_id=user)


def user_of(url: str) -> str:
    """The RabbitMQ user an AMQP URL logs in as (aio-pika's default, ``guest``, when it names none)."""
    return unquote(urlsplit(url).username or "") or "guest"
