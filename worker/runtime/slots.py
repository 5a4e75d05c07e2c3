"""Admission control: at most ``concurrency`` events in process at once, granted in turn at two levels, the
shards and, inside each shard, its guilds; a wait for a slot loses to a stop.

Every event the worker holds waits here for a slot under its tenant (its *key*: a guild of a shard, see
:mod:`worker.runtime.fair`), whose *group* is its shard. A freed slot goes to the shard whose turn it is and,
inside that shard, to the guild whose turn it is, one event per turn (a deficit round robin at each level,
whose events all cost one): a shard with one event waiting is served after at most one event of each other
waiting shard, however many events a loud shard holds, and a guild with one event waiting after at most one
event of each other waiting guild of its shard, however many a loud guild holds. The last free slot only
goes to a shard with nothing in process, so the first event of a quiet shard beside a loud one starts at
once (docs/fair-shares.md).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable


def _itself(key: Hashable) -> Hashable:
    return key


class Slots:
    """At most ``concurrency`` events processed at once, granted in turn across groups (shards) and, inside a
    group, across its keys (guilds); ``group_of`` gives a key's group (the key itself: one level). A wait for
    a slot loses to a stop."""

    def __init__(
        self,
        concurrency: int,
        stopping: asyncio.Event,
        *,
        group_of: Callable[[Hashable], Hashable] = _itself,
    ) -> None:
        self._free = concurrency
        self._stopping = stopping
        self._group_of = group_of
        #: slots each group holds now; the last free slot goes only to a group that holds none (see take)
        self._running: dict[Hashable, int] = {}
        #: the waiters of each key with any, oldest first
        self._waiting: dict[Hashable, deque[asyncio.Future[bool]]] = {}
        #: the groups with waiters, in the order their turns come
        self._turns: deque[Hashable] = deque()
        #: inside each such group, its keys with waiters, in the order their turns come
        self._members: dict[Hashable, deque[Hashable]] = {}
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
        group = self._group_of(key)
        held = self._running.get(group, 0) - 1
        if held > 0:
            self._running[group] = held
        else:
            self._running.pop(group, None)
        self._grant()

    def _may_take(self, group: Hashable) -> bool:
        """A free slot for ``group``: the last one only when ``group`` holds none, so a shard whose events
        fill the worker always leaves one slot for the next shard's event, which then starts at once."""
        return self._free > 1 or (self._free == 1 and group not in self._running)

    def _took(self, group: Hashable) -> None:
        self._free -= 1
        self._running[group] = self._running.get(group, 0) + 1

    def try_take(self, key: Hashable = None) -> bool:
        """A slot for an event of ``key`` now, if one is free for it and no other key waits for its turn."""
        group = self._group_of(key)
        if self._stopping.is_set() or self._turns or not self._may_take(group):
            return False
        self._took(group)
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
            group = self._group_of(key)
            members = self._members.get(group)
            if members is None:
                members = self._members[group] = deque()
                self._turns.append(group)
            members.append(key)
        queue.append(granted)
        self._grant()  # a free slot the groups ahead may not take (the last one) may be this key's
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
        passed = 0  # groups passed over in a row (the last slot, which only a group holding none may take)
        while self._free > 0 and passed < len(self._turns):
            group = self._turns.popleft()
            members = self._members[group]
            if self._may_take(group) and self._grant_in(members):
                self._took(group)
                passed = 0
            else:
                passed += 1
            if members:
                self._turns.append(group)  # its next event waits for its next turn
            else:
                del self._members[group]

    def _grant_in(self, members: deque[Hashable]) -> bool:
        """Grant the oldest waiter of the key whose turn it is among ``members``; the key goes to the back
        while it has waiters. False when none of them waits any more (cancelled waits)."""
        while members:
            key = members.popleft()
            queue = self._waiting[key]
            while queue and queue[0].done():  # cancelled waits
                queue.popleft()
            if not queue:
                del self._waiting[key]
                continue
            queue.popleft().set_result(True)
            if any(not waiter.done() for waiter in queue):
                members.append(key)
            else:
                del self._waiting[key]
            return True
        return False

    async def _refuse_on_stop(self) -> None:
        """Every wait loses to a stop: the waiters hear ``False`` and keep no slot."""
        await self._stopping.wait()
        for queue in self._waiting.values():
            for waiter in queue:
                if not waiter.done():
                    waiter.set_result(False)
        self._waiting.clear()
        self._members.clear()
        self._turns.clear()
