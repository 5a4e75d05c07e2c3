"""The read-only pass of ``list``, ``show``, ``history`` and the page, and what it keeps of each dead letter.

A pass holds every message it was given until it ends, so that each is seen exactly once and all go back in
the order taken (:mod:`worker.ops.dlq.sweep`). Holding is not keeping: each message is reduced to what the
view needs (:class:`Seen`: its description, and only for ``show`` and a letter's page its headers,
properties and at most :data:`MAX_KEPT_BODY` bytes of body) the moment it arrives, and its body is dropped.
So the memory of a view does not grow with the bytes in the DLQ: 1,000 letters of 255 KB cost what 1,000
descriptions cost.

Reading is not neutral, and cannot be made so: RabbitMQ has no way to look at a queue without taking its
messages, and putting one back makes the broker count it (a quorum queue's ``x-delivery-count`` rises by one
and ``redelivered`` is set). ``show`` and the page therefore call that header "times read from the DLQ"; the
processing attempts are ``x-ltm-attempts``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aio_pika import IncomingMessage
from aio_pika.abc import AbstractIncomingMessage
from aiormq.abc import DeliveredMessage

from worker.aio import close_quietly
from worker.broker.dead_letters import Letter, message_properties, read_dead_letter
from worker.ops.dlq.selection import Selection
from worker.ops.dlq.sweep import (
    CHANNEL_GONE,
    DEFAULT_BATCH,
    GET_TIMEOUT,
    DeadLetterQueue,
    Pass,
    Sweep,
    queue_depth,
)

#: a pass with a consumer holds every message it was given until it ends: AMQP's prefetch count is 16 bits,
#: so a deeper queue is read with basic.get instead
MAX_PREFETCH = 65535
#: how long a read-only pass waits for the next delivery before it asks whether any is left
IDLE_CHECK = 0.5
#: how long a pass that has seen fewer messages than it counted waits, with none left ready, for deliveries
#: still on their way (a message the broker has sent is no longer "ready"; on a loaded machine it can take
#: longer than IDLE_CHECK to be read: `dlq list --json` left one of six out in a CI run with a core busy)
#: before it takes it that another client took the rest
IN_FLIGHT_WAIT = 5.0
#: the most body bytes a whole view (``show``, a letter's page) keeps of one dead letter; the rest is counted
MAX_KEPT_BODY = 1024 * 1024
#: the broker's count of deliveries, raised by every read of the DLQ (and set by RabbitMQ, not the worker)
DELIVERY_COUNT = "x-delivery-count"
#: what it counts, as ``show`` and the page say it: reads of the DLQ, not processing attempts
DELIVERY_COUNT_MEANS = (
    "every list, show and page view takes each letter and puts it back, and RabbitMQ counts that in "
    "x-delivery-count; the processing attempts are x-ltm-attempts"
)


@dataclass(frozen=True, slots=True)
class Seen:
    """What a read-only pass keeps of a dead letter: its description and, for a whole view, its headers,
    properties and the first :data:`MAX_KEPT_BODY` bytes of its body."""

    letter: Letter
    body_size: int
    headers: Mapping[str, Any] = field(default_factory=dict)
    properties: list[tuple[str, Any]] = field(default_factory=list)
    exchange: str = ""
    routing_key: str = ""
    redelivered: bool = False
    body: bytes = b""
    #: a letter read from the table the workers keep: its state in words (kept.py ``LetterState``), shown
    #: where a letter read from the queue shows how often it was read
    state: str | None = None

    @property
    def body_cut(self) -> bool:
        """Whether only the start of the body was kept."""
        return len(self.body) < self.body_size

    @property
    def times_read(self) -> int | None:
        """How often the letter was taken from the DLQ and put back before (``x-delivery-count``)."""
        value = self.headers.get(DELIVERY_COUNT)
        return value if isinstance(value, int) and not isinstance(value, bool) else None


def summary(message: AbstractIncomingMessage, letter: Letter) -> Seen:
    """What a list keeps: the description alone."""
    return Seen(letter, len(message.body))


def whole(message: AbstractIncomingMessage, letter: Letter) -> Seen:
    """What ``show`` and a letter's page keep: everything but a body's bytes past :data:`MAX_KEPT_BODY`."""
    return Seen(
        letter,
        len(message.body),
        dict(message.headers or {}),
        message_properties(message),
        message.exchange or "",
        message.routing_key or "",
        bool(message.redelivered),
        message.body[:MAX_KEPT_BODY],
    )


async def read(
    dlq: DeadLetterQueue,
    selection: Selection = Selection(),
    *,
    batch: int = DEFAULT_BATCH,
    limit: int | None = None,
    details: bool = False,
) -> Sweep[Seen] | Reading:
    """Start a read-only pass (use it as ``async with``): a consumer (:class:`Reading`) when the queue fits
    in one prefetch window, else a basic.get sweep. Either holds every message until it ends and puts them
    all back in the order taken; each selected letter is handed over as :func:`whole` with ``details``, else
    as a :func:`summary`."""
    keep = whole if details else summary
    channel, expected = await dlq.open_pass(batch)
    now = datetime.now(UTC)
    # deeper than a prefetch window: the basic.get pass, on the same channel
    pass_of = Sweep if expected > MAX_PREFETCH else Reading
    reading = pass_of(
        channel,
        dlq.name,
        dlq.topology,
        selection,
        keep,
        expected=expected,
        batch=batch,
        limit=limit,
        now=now,
        trusted=dlq.trusted,
    )
    if isinstance(reading, Reading):
        await reading.start()
    return reading


class Reading(Pass[Seen]):
    """A read-only pass with one consumer.

    The same promise as a sweep (each message seen once, held unacked until the pass ends, all put back in
    the order taken, dead letters that arrive meanwhile left for the next pass) at a fraction of its cost on
    a quorum queue: ``basic.get`` is one queue command per message and the sweep's release one
    ``basic.nack`` each, while a consumer is given up to ``expected`` messages (its prefetch) without asking
    and the pass ends with one ``basic.cancel`` and a ``basic.nack(requeue=True)`` per message in the order
    given (no reply to wait for). If the tool dies, the broker requeues whatever it held: nothing is lost.
    Nothing is ever acked here.

    The prefetch cannot be smaller than the queue without giving messages back mid-pass, which brings them
    straight back to this consumer (a requeued message is served first on RabbitMQ 4.x); what is bounded
    instead is what the process keeps: each delivery is reduced as it arrives (aiormq buffers at most ten
    frames per channel and stops reading the socket beyond that), and only the reduced form waits for
    :meth:`next_batch`.
    """

    def _init_state(self) -> None:
        #: per delivery, in order: what is kept of it, or None when the selection does not pick it
        self._inbox: asyncio.Queue[Seen | None] = asyncio.Queue()
        self._consumer_tag: str | None = None
        #: the highest delivery tag given to this channel: releasing up to it releases everything
        self._highest = 0
        self._exhausted = self.expected == 0

    async def start(self) -> None:
        if self._exhausted:
            return
        underlay = await self._channel.get_underlay_channel()
        # at most the messages present now: the pass ends with them, like a sweep
        await underlay.basic_qos(prefetch_count=self.expected)
        ok = await underlay.basic_consume(self._queue_name, self._deliver, no_ack=False)
        self._consumer_tag = ok.consumer_tag

    async def _deliver(self, delivered: DeliveredMessage) -> None:
        """Reduce the delivery now: the body goes with it unless a whole view selected it."""
        self._highest = max(self._highest, delivered.delivery_tag or 0)
        message = IncomingMessage(delivered, no_ack=False)
        letter = read_dead_letter(message, self._topology, self._trusted)
        self._inbox.put_nowait(
            self._keep(message, letter) if self._selection.matches(letter, self.now) else None
        )

    async def next_batch(self) -> list[Seen] | None:
        if self._done():
            return None
        found: list[Seen] = []
        taken = 0
        idle_since = time.monotonic()
        while taken < self._batch and not self._done():
            try:
                kept = await asyncio.wait_for(self._inbox.get(), IDLE_CHECK)
            except TimeoutError:
                # fewer messages than counted at the start: the rest are on their way, or another client took
                # them. Stop once none is ready and none has come for IN_FLIGHT_WAIT, or after as long as a
                # basic.get may take
                ready = await queue_depth(self._channel, self._queue_name)
                idle = time.monotonic() - idle_since
                if (ready == 0 and idle > IN_FLIGHT_WAIT) or idle > GET_TIMEOUT:
                    self._exhausted = True
                continue
            idle_since = time.monotonic()
            taken += 1
            self.scanned += 1
            if kept is not None:
                self.selected += 1
                found.append(kept)
        return found

    async def close(self) -> None:
        """Stop the consumer and put every message back, in the order taken; close the channel."""
        try:
            if not self._channel.is_closed and self._consumer_tag is not None:
                await self._release()
        except CHANNEL_GONE:  # the channel's close below requeues everything it held
            pass
        finally:
            await close_quietly(self._channel)

    async def _release(self) -> None:
        """Cancel the consumer and nack every message, oldest first; wait until the queue shows them."""
        assert self._consumer_tag is not None
        underlay = await self._channel.get_underlay_channel()
        await underlay.basic_cancel(self._consumer_tag)
        if self._highest:
            ready_before = await queue_depth(self._channel, self._queue_name)
            # one nack per message, oldest first: a quorum queue returns the messages of one
            # multiple nack in no particular order once there are more than a few dozen
            held = self._highest  # delivery tags count from 1 on a fresh channel
            for tag in range(1, held + 1):
                await underlay.basic_nack(tag, multiple=False, requeue=True)
            await self._wait_until_ready(ready_before + held)
