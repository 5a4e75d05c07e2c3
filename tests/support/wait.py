"""One way to wait: poll a condition until it holds, with a deadline, instead of sleeping a fixed time."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

#: the default deadline of every wait in the suite (seconds): long enough for a busy two-core machine, and
#: only ever reached by a test that is failing anyway
DEADLINE = 60.0
#: how often a condition is looked at
INTERVAL = 0.05


async def eventually(
    condition: Callable[[], Any],
    what: str,
    timeout: float = DEADLINE,
    *,
    interval: float = INTERVAL,
    in_thread: bool = False,
) -> Any:
    """Poll ``condition()`` until it returns something truthy, and return that value; raise AssertionError
    naming ``what`` once ``timeout`` seconds have passed. The condition may return an awaitable (awaited);
    ``in_thread`` runs a blocking one (a docker command) in a thread, so the event loop goes on meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        value = await asyncio.to_thread(condition) if in_thread else condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        await asyncio.sleep(interval)


async def holds_within(condition: Callable[[], Any], timeout: float = DEADLINE) -> bool:
    """Whether ``condition()`` becomes true within ``timeout`` seconds (polled; False is an answer here,
    not a failure)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(INTERVAL)
