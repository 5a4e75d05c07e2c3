"""Small asyncio helpers: :func:`side_by_side`, :func:`first_of`, :func:`close_quietly`,
:func:`cancel_within`, :func:`finish_within`.

:func:`side_by_side`: two awaitables side by side, with one task where ``asyncio.gather`` makes two.

The hot path awaits pairs (a result and its notice, the AMQP outputs and the Redis invalidation): gather
wraps each coroutine in a task of its own; here the first runs in the caller's task and only the second gets
one. Unlike gather, a failure does not leave the other running unobserved: both are always awaited, then
the first's failure is raised, else the second's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Coroutine
from typing import Any, Protocol


class Closable(Protocol):
    """An aio-pika connection or channel, as :func:`close_quietly` uses it."""

    @property
    def is_closed(self) -> bool: ...

    def close(self) -> Awaitable[Any]: ...


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


async def first_of(*waits: Any) -> None:
    """Wait until the first of ``waits`` completes; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


async def close_quietly(closable: Closable) -> None:
    """Close a connection or channel, at most 5 s, whatever state it is in; a failure is not raised."""
    if closable.is_closed:
        return
    with contextlib.suppress(Exception):
        await asyncio.wait_for(closable.close(), timeout=5)


async def cancel_within(task: asyncio.Future[Any], timeout: float) -> bool:
    """Cancel ``task`` and wait at most ``timeout`` seconds for it to end; whether it ended. A task that
    ignores the cancel for longer (asyncpg returning a connection to its pool waits on a Postgres that does
    not answer, with no bound of its own) is left to end when its connection is terminated: ``await task``
    or ``asyncio.wait_for`` would wait for it as long."""
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if task in done and not task.cancelled():
        task.exception()  # observed: a failure while it was being cancelled is not this caller's
    return task in done


async def finish_within(work: Awaitable[Any], timeout: float) -> bool:
    """Let ``work`` run at most ``timeout`` seconds; whether it finished (a failure counts as finished and is
    not raised). Past the bound it is cancelled and not waited for (see :func:`cancel_within`)."""
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if task in done:
        if not task.cancelled():
            task.exception()
        return True
    task.cancel()
    return False
