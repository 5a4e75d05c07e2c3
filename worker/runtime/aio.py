"""Two awaitables side by side, with one task where ``asyncio.gather`` makes two.

The hot path awaits pairs (a result and its notice, the AMQP outputs and the Redis invalidation): gather
wraps each coroutine in a task of its own; here the first runs in the caller's task and only the second gets
one. Unlike gather, a failure does not leave the other running unobserved: both are always awaited, then
the first's failure is raised, else the second's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from typing import Any


async def side_by_side(first: Awaitable[Any], second: Coroutine[Any, Any, Any]) -> None:
    """Await ``first`` and ``second`` concurrently; raise the first failure (``first``'s before ``second``'s)
    once both are done. Cancelling the caller cancels both."""
    other = asyncio.ensure_future(second)
    try:
        await first
    except BaseException as exc:
        if isinstance(exc, asyncio.CancelledError):
            other.cancel()
        await asyncio.wait([other])
        if not other.cancelled():
            other.exception()  # observed: the first failure is the one raised
        raise
    await other
