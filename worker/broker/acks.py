"""Settling the deliveries of one consuming channel, with as few frames as the delivery tags allow.

Events answered together (a batch comes back from Postgres, its results are confirmed together) ask for
their acks in the same turn of the event loop. Those acks leave together: one ``basic.ack`` with
``multiple=True`` for the run of tags that are all settled or ready from the lowest unsettled tag up, and a
single ``basic.ack`` for each ready tag past a gap. A gap is a delivery still in flight (or one whose task
has not started yet: a tag this class has not heard of is unsettled), so a multiple ack never covers a
delivery that is not done. Nacks (handing a delivery back) leave at once, one frame each.

Every frame goes through one lock, in the order it was planned: a multiple ack is only planned once every
single ack or nack below it is already queued on the connection, so the broker never sees a tag settled
twice (which would close the channel).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Protocol


class AckChannel(Protocol):
    """What this needs of a channel (aiormq's ``Channel``)."""

    def basic_ack(self, delivery_tag: int, multiple: bool = False, wait: bool = True) -> Awaitable[None]: ...

    def basic_nack(
        self, delivery_tag: int, multiple: bool = False, requeue: bool = True, wait: bool = True
    ) -> Awaitable[None]: ...


class Delivery(Protocol):
    """What this needs of a delivery (aio-pika's ``AbstractIncomingMessage``): its tag on the channel."""

    @property
    def delivery_tag(self) -> int | None: ...


def tag_of(delivery: Delivery) -> int:
    """The delivery's tag on its channel (every delivery of a consumer that acks has one)."""
    tag = delivery.delivery_tag
    if tag is None:
        raise ValueError("a delivery without a tag cannot be acked (consumed with no_ack?)")
    return tag


class AlreadySettled(RuntimeError):
    """A delivery was acked or nacked twice (a bug in the caller)."""


class Acks:
    """Acks and nacks the deliveries of ``channel``: one instance per channel (its tags are its own)."""

    def __init__(self, channel: AckChannel) -> None:
        self._channel = channel
        #: every tag up to this one is settled
        self._through = 0
        #: tags past ``_through`` settled on their own (single ack, nack)
        self._done: set[int] = set()
        #: tags whose ack waits for the next flush, and the future their callers await
        self._ready: set[int] = set()
        self._flushed: asyncio.Future[None] | None = None
        self._lock = asyncio.Lock()
        self._senders: set[asyncio.Future[None]] = set()
        #: frames sent and deliveries they settled (the tests and the bench read them)
        self.ack_frames = 0
        self.acked = 0
        self.nack_frames = 0

    def settled(self, delivery: Delivery) -> bool:
        """True once ``delivery`` was acked or nacked (or its ack is waiting for the flush)."""
        return self._settled(tag_of(delivery))

    def _settled(self, tag: int) -> bool:
        return tag <= self._through or tag in self._done or tag in self._ready

    async def ack(self, delivery: Delivery) -> None:
        """Ack ``delivery`` with the other acks asked for in this turn of the loop; returns once its frame is
        queued on the connection. Raises when the channel is closed (the broker then redelivers it)."""
        tag = tag_of(delivery)
        if self._settled(tag):
            raise AlreadySettled(f"delivery {tag} is already settled")
        self._ready.add(tag)
        if self._flushed is None:
            self._flushed = asyncio.get_running_loop().create_future()
            # a task's first step runs on the loop's next turn: the acks of this turn are all in by then
            sender = asyncio.ensure_future(self._send())
            self._senders.add(sender)  # the loop keeps only a weak reference to a task
            sender.add_done_callback(self._senders.discard)
        # several callers await one future: shield it, so a cancelled caller does not cancel the others'
        await asyncio.shield(self._flushed)

    async def nack(self, delivery: Delivery, *, requeue: bool = True) -> None:
        """Hand ``delivery`` back (``requeue``) or drop it, at once, on its own frame."""
        tag = tag_of(delivery)
        if self._settled(tag):
            raise AlreadySettled(f"delivery {tag} is already settled")
        async with self._lock:
            await self._channel.basic_nack(tag, requeue=requeue, wait=False)
            self.nack_frames += 1
            self._settle_single(tag)

    async def _send(self) -> None:
        async with self._lock:
            # planned under the lock (every frame planned before is already queued); the tags and the future
            # their callers await are taken together, so each caller hears how its own frame went
            ready, flushed = self._ready, self._flushed
            self._ready, self._flushed = set(), None
            if flushed is None:
                return
            try:
                await self._send_acks(ready)
            except asyncio.CancelledError:
                flushed.cancel()
                raise
            except Exception as exc:  # the channel is gone: every caller of this flush hears it
                flushed.set_exception(exc)
            else:
                flushed.set_result(None)

    async def _send_acks(self, ready: set[int]) -> None:
        run_end, last_ready = self._through, 0
        while (run_end + 1) in ready or (run_end + 1) in self._done:
            run_end += 1
            if run_end in ready:
                last_ready = run_end
        if last_ready:
            await self._channel.basic_ack(last_ready, multiple=True, wait=False)
            self.ack_frames += 1
            for tag in range(self._through + 1, run_end + 1):
                if tag in ready:
                    ready.discard(tag)
                    self.acked += 1
                self._done.discard(tag)
            self._through = run_end
        for tag in sorted(ready):
            await self._channel.basic_ack(tag, multiple=False, wait=False)
            self.ack_frames += 1
            self.acked += 1
            self._settle_single(tag)

    def _settle_single(self, tag: int) -> None:
        self._done.add(tag)
        while (self._through + 1) in self._done:
            self._through += 1
            self._done.discard(self._through)
