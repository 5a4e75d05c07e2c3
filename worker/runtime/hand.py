"""What one worker holds: the deliveries it has been given and not yet settled, counted by shard.

The common work queue pushes up to ``LTM_PREFETCH`` deliveries ahead of processing, so that one shard's
burst is taken off the queue at once and every other shard's next event reaches the worker without waiting
behind it (:class:`~worker.runtime.slots.Slots` then serves the shards in turn). What the worker holds is
bounded twice:

- **A shard's share.** Once the worker holds 3/4 of its prefetch window (or of its byte budget), an event
  of a shard that holds more than its share (the held events divided among the shards holding any) is
  moved to that shard's own queue instead of waiting here (:meth:`Hand.moves`): the loud shard waits in its
  own queue, under its own bound, and the window stays open for the others.
- **Bytes.** Past ``LTM_HELD_BYTES_MAX`` the worker stops taking from the common queue until it holds half
  of it again (:attr:`Hand.over_budget`).

No I/O here: the consumer asks and acts (docs/fair-shares.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable


class Hand:
    """Held deliveries and their body bytes, in all and per shard key."""

    def __init__(
        self,
        window: int,
        max_bytes: int,
        *,
        on_change: Callable[[Hashable, int], None] | None = None,
    ) -> None:
        self._window = window
        self._max_bytes = max_bytes
        self._count: dict[Hashable, int] = {}
        self.total = 0
        self.bytes = 0
        #: set while the bytes held are under the budget (taking from the common queue is allowed); cleared
        #: at the budget, set again at half of it; ``over_budget_event`` is its opposite
        self.under_budget = asyncio.Event()
        self.under_budget.set()
        self.over_budget_event = asyncio.Event()
        self._on_change = on_change

    def held(self, key: Hashable) -> int:
        return self._count.get(key, 0)

    @property
    def keys(self) -> int:
        """Shards holding any event here."""
        return len(self._count)

    @property
    def over_budget(self) -> bool:
        return not self.under_budget.is_set()

    def add(self, key: Hashable, size: int) -> None:
        count = self._count.get(key, 0) + 1
        self._count[key] = count
        self.total += 1
        self.bytes += size
        if self.bytes >= self._max_bytes and self.under_budget.is_set():
            self.under_budget.clear()
            self.over_budget_event.set()
        if self._on_change is not None:
            self._on_change(key, count)

    def remove(self, key: Hashable, size: int) -> None:
        count = self._count.get(key, 0) - 1
        if count > 0:
            self._count[key] = count
        else:
            self._count.pop(key, None)
            count = 0
        self.total -= 1
        self.bytes -= size
        if self.bytes <= self._max_bytes // 2 and not self.under_budget.is_set():
            self.over_budget_event.clear()
            self.under_budget.set()
        if self._on_change is not None:
            self._on_change(key, count)

    def moves(self, key: Hashable) -> bool:
        """Whether a newly held (and counted) event of ``key`` should go to its shard's own queue: the worker
        is three quarters full (events or bytes) and ``key`` holds at least its share of it. A shard alone
        moves too: the window it would fill is the one the next shard's first event arrives through."""
        if self.total * 4 < self._window * 3 and self.bytes * 4 < self._max_bytes * 3:
            return False
        return self.held(key) * self.keys >= self.total
