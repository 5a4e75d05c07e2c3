"""The client's duplicate filter: a bounded memory of the event ids whose results and notices it has already
handed over, so that a copy the broker delivers again (a redelivery, a replayed result) is dropped."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")


class SeenSet(Generic[V]):
    """A bounded memory of keys seen recently: at most ``capacity`` entries, each forgotten ``ttl`` seconds
    after it was stored (the oldest go first when full)."""

    def __init__(self, capacity: int, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        if capacity <= 0 or ttl <= 0:
            raise ValueError("capacity and ttl must be > 0")
        self.capacity, self.ttl, self._clock = capacity, ttl, clock
        self._entries: OrderedDict[str, tuple[V, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self._clock() - entry[1] >= self.ttl:
            del self._entries[key]
            return None
        return entry[0]

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def set(self, key: str, value: V) -> None:
        now = self._clock()
        self._entries.pop(key, None)
        self._entries[key] = (value, now)
        while self._entries:
            oldest, (_, at) = next(iter(self._entries.items()))
            if len(self._entries) <= self.capacity and now - at < self.ttl:
                break
            del self._entries[oldest]
