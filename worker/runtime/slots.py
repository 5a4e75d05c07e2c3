"""Admission control: at most ``concurrency`` events in process at once; a wait for a slot loses to a stop."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


class Slots:
    """At most ``concurrency`` events processed at once; a wait for a slot loses to a stop."""

    def __init__(self, concurrency: int, stopping: asyncio.Event) -> None:
        self._free = asyncio.Semaphore(concurrency)
        self._stopping = stopping

    @property
    def all_taken(self) -> bool:
        return self._free.locked()

    def release(self) -> None:
        self._free.release()

    async def take(self) -> bool:
        """Wait for a slot; ``False`` when the worker starts stopping first.

        A slot taken here is released by the caller. If this wait is cancelled (connection lost) or loses
        to the stop, a slot it won anyway is given back: a leaked slot would idle the worker.
        """
        if self._stopping.is_set():
            return False
        if not self._free.locked():
            await self._free.acquire()
            return True
        acquire = asyncio.ensure_future(self._free.acquire())
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({acquire, stop}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            await self._give_back(acquire)
            raise
        finally:
            stop.cancel()
        if acquire.done() and not self._stopping.is_set():
            return True
        await self._give_back(acquire)
        return False

    async def _give_back(self, acquire: asyncio.Future[Any]) -> None:
        """Abandon a slot wait: cancel it, and release the slot if it was won before the cancel landed."""
        if not acquire.done():
            acquire.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({acquire})
        if acquire.done() and not acquire.cancelled() and acquire.exception() is None:
            self._free.release()
