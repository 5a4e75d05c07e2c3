"""What one worker holds: the deliveries it has been given and not yet settled, counted by tenant (a guild of
a shard that passed the checks, or :data:`~worker.runtime.fair.UNCHECKED`) and by the tenant's group (its
shard), and their body bytes.

It answers two questions for :class:`~worker.runtime.fair.FairShares`, and does no I/O:

- **Is a tenant over its share?** (:meth:`Hand.moves`) Once the worker holds 3/4 of its prefetch window (or
  of its byte budget), a guild whose shard holds at least the shard's share (the held events divided among
  the shards holding any) and which holds at least its own share of its shard's (divided among the shard's
  guilds holding any) has its next events moved to its shard's own queue: the loud guild of the loud shard
  waits there, under the shard's bound, and the window stays open for the other shards and for the shard's
  other guilds.
- **Is the byte budget spent?** (:attr:`Hand.full`) At ``LTM_HELD_BYTES_MAX`` the worker stops consuming
  every queue, the common one and the shards' own, until it holds half of it again; and whatever the broker
  had already pushed past the budget and one more body (:meth:`Hand.fits`) is handed back unread, so the
  bodies held never exceed the budget by more than :data:`MARGIN_BYTES`, whatever the window.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable

from contracts.models import MAX_BODY_BYTES


def _itself(key: Hashable) -> Hashable:
    return key


#: how far past ``LTM_HELD_BYTES_MAX`` the bodies held may go: one body of the contract's largest size (the
#: delivery that crossed the budget is held; the next one is handed back)
MARGIN_BYTES = MAX_BODY_BYTES


class Hand:
    """Held deliveries and their body bytes, in all, per tenant key and per group (``group_of`` a key; the
    key itself: one level). ``on_change`` hears a group's new count."""

    def __init__(
        self,
        window: int,
        max_bytes: int,
        *,
        group_of: Callable[[Hashable], Hashable] = _itself,
        on_change: Callable[[Hashable, int], None] | None = None,
    ) -> None:
        self._window = window
        self.max_bytes = max_bytes
        self._group_of = group_of
        self._count: dict[Hashable, int] = {}
        self._group_count: dict[Hashable, int] = {}
        #: per group, its keys holding any
        self._group_keys: dict[Hashable, int] = {}
        self.total = 0
        self.bytes = 0
        #: set from the moment the bodies held reach the budget until they are back at half of it
        self.full = asyncio.Event()
        #: the opposite of :attr:`full` (something to wait on until the worker may take again)
        self.room = asyncio.Event()
        self.room.set()
        self._on_change = on_change

    def held(self, key: Hashable) -> int:
        return self._count.get(key, 0)

    def held_by_group(self, group: Hashable) -> int:
        return self._group_count.get(group, 0)

    @property
    def groups(self) -> int:
        """Groups (shards) holding any event here."""
        return len(self._group_count)

    def fits(self, size: int) -> bool:
        """Whether a body of ``size`` bytes may be held: the bodies held stay within the budget plus
        :data:`MARGIN_BYTES`. An empty hand takes anything (a body over the contract's limit is read, found
        too large and dead-lettered, never handed back for ever)."""
        return self.total == 0 or self.bytes + size <= self.max_bytes + MARGIN_BYTES

    def add(self, key: Hashable, size: int) -> None:
        count = self._count.get(key, 0) + 1
        self._count[key] = count
        group = self._group_of(key)
        if count == 1:
            self._group_keys[group] = self._group_keys.get(group, 0) + 1
        group_count = self._group_count[group] = self._group_count.get(group, 0) + 1
        self.total += 1
        self.bytes += size
        if self.bytes >= self.max_bytes and not self.full.is_set():
            self.room.clear()
            self.full.set()
        if self._on_change is not None:
            self._on_change(group, group_count)

    def remove(self, key: Hashable, size: int) -> None:
        count = self._count.get(key, 0) - 1
        group = self._group_of(key)
        if count > 0:
            self._count[key] = count
        else:
            self._count.pop(key, None)
            keys = self._group_keys.get(group, 0) - 1
            if keys > 0:
                self._group_keys[group] = keys
            else:
                self._group_keys.pop(group, None)
        group_count = self._group_count.get(group, 0) - 1
        if group_count > 0:
            self._group_count[group] = group_count
        else:
            self._group_count.pop(group, None)
            group_count = 0
        self.total -= 1
        self.bytes -= size
        if self.bytes <= self.max_bytes // 2 and self.full.is_set():
            self.full.clear()
            self.room.set()
        if self._on_change is not None:
            self._on_change(group, group_count)

    def moves(self, key: Hashable) -> bool:
        """Whether a newly held (and counted) event of ``key`` should go to its shard's own queue: the worker
        is three quarters full (events or bytes), ``key``'s group holds at least its share of it, and ``key``
        at least its share of its group's. A shard alone moves too (the window it would fill is the one the
        next shard's first event arrives through), and so does a guild alone in its shard."""
        if self.total * 4 < self._window * 3 and self.bytes * 4 < self.max_bytes * 3:
            return False
        group = self._group_of(key)
        in_group = self.held_by_group(group)
        if in_group * self.groups < self.total:
            return False
        return self.held(key) * self._group_keys.get(group, 1) >= in_group
