"""Admission control: at most ``concurrency`` events in process at once, granted to the shards in turn; a
wait for a slot loses to a stop.

Every event the worker holds waits here for a slot under its shard (its *key*). A freed slot goes to the
shard whose turn it is, one event per turn (round robin, a deficit round robin whose events all cost one),
so a shard with one event waiting is served after at most one event of each other waiting shard, however
many events a loud shard holds; and the last free slot only goes to a shard with nothing in process, so the
first event of a quiet shard beside a loud one starts at once (docs/fair-shares.md).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable


class Slots:
    """At most ``concurrency`` events processed at once, granted in turn across keys (shards); a wait for a
    slot loses to a stop."""

    def __init__(self, concurrency: int, stopping: asyncio.Event) -> None:
        self._free = concurrency
        self._stopping = stopping
        #: slots each key holds now; the last free slot goes only to a key that holds none (see take)
        self._running: dict[Hashable, int] = {}
        #: the waiters of each key with any, oldest first
        self._waiting: dict[Hashable, deque[asyncio.Future[bool]]] = {}
        #: the keys with waiters, in the order their turns come
        self._turns: deque[Hashable] = deque()
        self._watch: asyncio.Task[None] | None = None

    @property
    def all_taken(self) -> bool:
        return self._free <= 0

    @property
    def waiting(self) -> int:
        """Events waiting for a slot."""
        return sum(len(queue) for queue in self._waiting.values())

    def release(self, key: Hashable = None) -> None:
        """Give back a slot ``key`` took."""
        self._free += 1
        held = self._running.get(key, 0) - 1
        if held > 0:
            self._running[key] = held
        else:
            self._running.pop(key, None)
        self._grant()

    def _may_take(self, key: Hashable) -> bool:
        """A free slot for ``key``: the last one only when ``key`` holds none, so a shard whose events
        fill the worker always leaves one slot for the next shard's event, which then starts at once."""
        return self._free > 1 or (self._free == 1 and key not in self._running)

    def _took(self, key: Hashable) -> None:
        self._free -= 1
        self._running[key] = self._running.get(key, 0) + 1

    def try_take(self, key: Hashable = None) -> bool:
        """A slot for an event of ``key`` now, if one is free for it and no other key waits for its turn."""
        if self._stopping.is_set() or self._turns or not self._may_take(key):
            return False
        self._took(key)
        return True

    async def take(self, key: Hashable = None) -> bool:
        """Wait for a slot for an event of ``key``; ``False`` when the worker starts stopping first.

        A slot taken here is released by the caller. If this wait is cancelled (connection lost) or loses
        to the stop, a slot it won anyway is given back: a leaked slot would idle the worker.
        """
        if self._stopping.is_set():
            return False
        if self.try_take(key):
            return True
        granted: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        queue = self._waiting.get(key)
        if queue is None:
            queue = self._waiting[key] = deque()
            self._turns.append(key)
        queue.append(granted)
        self._grant()  # a free slot the keys ahead may not take (the last one) may be this key's
        if self._watch is None or self._watch.done():
            self._watch = asyncio.ensure_future(self._refuse_on_stop())
        try:
            got = await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled() and granted.result():
                self.release(key)  # granted just before the cancel landed
            raise
        if got and self._stopping.is_set():  # granted as the stop came: the stop wins
            self.release(key)
            return False
        return got

    def _grant(self) -> None:
        if self._stopping.is_set():
            return  # the waiters hear the stop (_refuse_on_stop)
        passed = 0  # keys passed over in a row (the last slot, which only a key holding none may take)
        while self._free > 0 and passed < len(self._turns):
            key = self._turns.popleft()
            queue = self._waiting[key]
            while queue and queue[0].done():  # cancelled waits
                queue.popleft()
            if queue and self._may_take(key):
                queue.popleft().set_result(True)
                self._took(key)
                passed = 0
            else:
                passed += 1
            if any(not waiter.done() for waiter in queue):
                self._turns.append(key)  # its next event waits for its next turn
            else:
                del self._waiting[key]

    async def _refuse_on_stop(self) -> None:
        """Every wait loses to a stop: the waiters hear ``False`` and keep no slot."""
        await self._stopping.wait()
        for queue in self._waiting.values():
            for waiter in queue:
                if not waiter.done():
                    waiter.set_result(False)
        self._waiting.clear()
        self._turns.clear()
