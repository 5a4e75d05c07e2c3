"""The DLQ's I/O: connect, check that the queue exists, and sweep it (each message taken once, held until
settled, the rest put back in order)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Generic, Self, TypeVar

import aiormq.exceptions
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage, AbstractQueue

from worker.aio import close_quietly
from worker.broker.dead_letters import Letter, read_dead_letter
from worker.broker.urls import NoNodeAnswered, connect_any, vhost_of
from worker.config import Topology
from worker.faults import refusal
from worker.ops.dlq.selection import Selection
from worker.redact import describe
from worker.redact import redact_url as redact

DEFAULT_BATCH = 1000
CONNECT_TIMEOUT = 10.0
GET_TIMEOUT = 30.0
SETTLE_TIMEOUT = 3.0
SETTLE_GRACE = 0.5


#: what a channel raises once it is closed under a command: an interrupted RPC (Ctrl-C) closes it, and
#: closing a channel requeues everything it held, so a release that meets one has nothing left to do
CHANNEL_GONE = (
    aiormq.exceptions.AMQPError,
    aiormq.exceptions.ChannelInvalidStateError,
    OSError,
    TimeoutError,
)


class DlqError(Exception):
    """A failure the operator must act on; the message says what and where."""


class Unreachable(DlqError):
    """RabbitMQ cannot be reached, or refused the connection."""


class Undeclared(DlqError):
    """The DLQ (or, for a replay, the work exchange) does not exist on the vhost."""


@dataclass(frozen=True, slots=True)
class Found:
    """A dead letter taken from the queue and held (unacked) by a sweep."""

    message: AbstractIncomingMessage
    letter: Letter


class DeadLetterQueue:
    """A connection to the broker on which the DLQ is known to exist."""

    def __init__(
        self,
        connection: AbstractConnection,
        url: str,
        topology: Topology,
        depth: int,
        trusted: frozenset[str] = frozenset(),
    ) -> None:
        self.connection = connection
        self.url = url
        self.topology = topology
        #: messages ready in the DLQ when it was opened
        self.depth = depth
        #: LTM_TRUSTED_PUBLISHERS: whose record of a letter's sender counts (``worker.broker.published_by``)
        self.trusted = trusted

    @property
    def name(self) -> str:
        return self.topology.dead_letter_queue

    async def recount(self) -> int:
        """Count the messages ready in the DLQ again (a passive declare): :attr:`depth` now."""
        channel = await self.connection.channel(publisher_confirms=False)
        try:
            self.depth = await queue_depth(channel, self.name)
        finally:
            await close_quietly(channel)
        return self.depth

    async def sweep(
        self,
        selection: Selection = Selection(),
        *,
        batch: int = DEFAULT_BATCH,
        limit: int | None = None,
        now: datetime | None = None,
    ) -> Sweep[Found]:
        """Start one pass over the queue that hands over the selected messages, held (use it as
        ``async with``)."""
        channel, expected = await self.open_pass(batch)
        return Sweep(
            channel,
            self.name,
            self.topology,
            selection,
            Found,
            expected=expected,
            batch=batch,
            limit=limit,
            now=now or datetime.now(UTC),
            trusted=self.trusted,
        )

    async def open_pass(self, batch: int) -> tuple[AbstractChannel, int]:
        """A channel for a pass of its own, and how many messages the queue holds now (the pass ends after
        that many)."""
        if batch < 1:
            raise ValueError("batch must be at least 1")
        channel = await self.connection.channel(publisher_confirms=False)
        return channel, await queue_depth(channel, self.name)

    async def work_exchange(self) -> AbstractChannel:
        """A confirm-mode channel for republishing, after checking the work exchange exists."""
        probe = await self.connection.channel(publisher_confirms=False)
        try:
            await probe.declare_exchange(self.topology.tool_calls_exchange, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            raise Undeclared(
                f"exchange {self.topology.tool_calls_exchange} does not exist on vhost "
                f"{vhost_of(self.url)!r}; has `worker run` ever started here?"
            ) from None
        finally:
            await close_quietly(probe)
        return await self.connection.channel(publisher_confirms=True, on_return_raises=True)


@contextlib.asynccontextmanager
async def open_dead_letters(
    url: str, topology: Topology, *, trusted: frozenset[str] = frozenset()
) -> AsyncIterator[DeadLetterQueue]:
    """Connect and check (passive declare on a throwaway channel) that the DLQ exists; ``trusted``:
    LTM_TRUSTED_PUBLISHERS, by which each letter's sender is read (``worker.broker.published_by``)."""
    try:
        # several nodes listed: the first that answers serves the whole command
        connection, url = await connect_any(url, timeout=CONNECT_TIMEOUT)
    except NoNodeAnswered as exc:
        raise Unreachable(f"cannot reach RabbitMQ: {exc}") from None
    except (OSError, TimeoutError, aiormq.exceptions.AMQPError) as exc:
        raise Unreachable(f"cannot reach RabbitMQ at {redact(url)}: {_connect_reason(exc, url)}") from None
    try:
        probe = await connection.channel(publisher_confirms=False)
        try:
            depth = await queue_depth(probe, topology.dead_letter_queue)
        except aiormq.exceptions.ChannelNotFoundEntity:
            raise Undeclared(
                f"queue {topology.dead_letter_queue} does not exist on vhost {vhost_of(url)!r}; "
                "has `worker run` ever started here?"
            ) from None
        finally:
            await close_quietly(probe)
        yield DeadLetterQueue(connection, url, topology, depth, trusted)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(connection.close(), timeout=5)


async def queue_depth(channel: AbstractChannel, name: str) -> int:
    """How many messages are ready in the queue ``name``."""
    queue = await channel.declare_queue(name, passive=True)
    result = queue.declaration_result
    return int(result.message_count or 0)


#: what a pass hands over of each dead letter it selects (``keep(message, letter)``): the message itself,
#: held (:class:`Found`), or what a read-only pass keeps of it (``reading.Seen``)
Kept = TypeVar("Kept")


class Pass(Generic[Kept]):
    """What a :class:`Sweep` and a ``reading.Reading`` share: the counts, when the pass is over, which
    messages it selects, what it keeps of them and the wait for released messages to show as ready again."""

    def __init__(
        self,
        channel: AbstractChannel,
        queue_name: str,
        topology: Topology,
        selection: Selection,
        keep: Callable[[AbstractIncomingMessage, Letter], Kept],
        *,
        expected: int,
        batch: int,
        limit: int | None,
        now: datetime,
        trusted: frozenset[str] = frozenset(),
    ) -> None:
        self._channel = channel
        self._queue_name = queue_name
        self._topology = topology
        self._trusted = trusted
        self._selection = selection
        self._keep = keep
        self.expected = expected
        self._batch = batch
        self._limit = limit
        self.now = now
        self.scanned = 0
        self.selected = 0
        self.removed = 0
        self._exhausted = False
        self._init_state()

    def _init_state(self) -> None:
        """Set up what a kind of pass keeps besides the counts."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        raise NotImplementedError

    def _done(self) -> bool:
        limit_reached = self._limit is not None and self.selected >= self._limit
        return self._exhausted or self.scanned >= self.expected or limit_reached

    def _consider(self, message: AbstractIncomingMessage, found: list[Kept]) -> None:
        """Count a message taken; add what the pass keeps of it to ``found`` if the selection picks its
        dead letter."""
        self.scanned += 1
        letter = read_dead_letter(message, self._topology, self._trusted)
        if self._selection.matches(letter, self.now):
            self.selected += 1
            found.append(self._keep(message, letter))

    async def _wait_until_ready(self, ready: int) -> None:
        """Wait (briefly) until the queue shows the released messages as ready again: a nack has no
        reply and the queue applies it a moment later; a command run right after this one must see them."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while await queue_depth(self._channel, self._queue_name) < ready:
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(0.01)


class Sweep(Pass[Kept]):
    """One pass over the DLQ on one channel: each message is taken once and held until settled.

    ``next_batch`` returns the selected dead letters of the next ``batch`` messages taken (possibly none),
    or None when the pass is over. The caller ``remove``s the ones it is done with; everything else is
    requeued, in the order it was taken, when the sweep closes.

    Messages are taken with ``basic.get`` (manual ack) and held unacked until the end of the pass, so every
    dead letter is seen exactly once wherever the broker puts a requeued message (a RabbitMQ 3.x quorum
    queue without a delivery limit appends it to the back; with one, and on 4.x, it is served again
    first). The pass stops after the number of messages the queue held when it started, so dead letters
    that arrive meanwhile (a replayed event failing again) are left for the next run. ``batch`` is how many
    bodies are in memory (and republishes await their confirms) at once; every message not removed is kept
    as a delivery tag only and released with ``basic.nack(requeue=True)`` one by one in the order taken, so
    the queue keeps its order. A nack, unlike a reject, does not count as a failed delivery on RabbitMQ
    4.3+. If the tool dies, the broker requeues whatever it still held: nothing is lost.
    """

    def _init_state(self) -> None:
        #: delivery tags taken and not acked yet, in the order taken (dict: ordered, O(1) delete)
        self._held: dict[int, None] = {}
        self._queue: AbstractQueue | None = None
        self._last_ack: float | None = None

    @property
    def held(self) -> int:
        return len(self._held)

    async def next_batch(self) -> list[Kept] | None:
        if self._done():
            return None
        if self._queue is None:
            self._queue = await self._channel.get_queue(self._queue_name, ensure=False)
        queue = self._queue
        found: list[Kept] = []
        taken = 0
        while taken < self._batch and not self._done():
            message = await queue.get(no_ack=False, fail=False, timeout=GET_TIMEOUT)
            if message is None:
                self._exhausted = True
                break
            taken += 1
            if message.delivery_tag is not None:
                self._held[message.delivery_tag] = None
            self._consider(message, found)
        return found

    async def remove(self, found: Sequence[Found]) -> None:
        """Ack: these dead letters leave the queue for good."""
        await self.remove_tags([item.message.delivery_tag for item in found if item.message.delivery_tag])

    async def remove_tags(self, tags: Sequence[int]) -> None:
        """Ack by delivery tag (lets a caller hold a selection without keeping the bodies)."""
        underlay = await self._channel.get_underlay_channel()
        for tag in tags:
            if tag in self._held:
                await underlay.basic_ack(tag, multiple=False)
                del self._held[tag]
                self.removed += 1
                self._last_ack = time.monotonic()

    async def close(self) -> None:
        """Requeue everything still held, in the order taken, and close the channel."""
        try:
            if self._held and not self._channel.is_closed:
                with contextlib.suppress(*CHANNEL_GONE):  # its close requeues all it held
                    ready_before = await queue_depth(self._channel, self._queue_name)
                    underlay = await self._channel.get_underlay_channel()
                    for tag in self._held:
                        await underlay.basic_nack(tag, multiple=False, requeue=True)
                    released = len(self._held)
                    self._held.clear()
                    await self._wait_until_ready(ready_before + released)
            if self._last_ack is not None and not self._channel.is_closed:
                # A quorum queue turns every ack of a basic.get delivery into its own command, and a
                # channel that sent more than a few dozen of them at once holds the rest back until the
                # first ones are applied; closing the channel then drops them and the broker requeues
                # messages that were acked (rabbitmq-server#10327). Nothing is lost that way (a replayed
                # dead letter would be in both queues), but give the acks time to go through.
                await asyncio.sleep(max(0.0, self._last_ack + SETTLE_GRACE - time.monotonic()))
        finally:
            # closing the channel requeues anything a failure above left unacked
            await close_quietly(self._channel)


def _connect_reason(exc: BaseException, url: str) -> str:
    # a refused login or vhost in the words every command uses (worker/faults.py)
    return refusal(exc, url) or describe(exc)
