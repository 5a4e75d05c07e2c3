"""How a delivery ends, decided over values: the retry-or-dead-letter policy, and the processing slots.

:func:`route_failure` is the whole policy for a failed attempt; the handler only carries out what it returns
(README "How an event can end"). No I/O here.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contracts.models import DeadLetterKind
from worker.broker.topology import backoff_tier
from worker.faults import is_transient
from worker.pipeline import outcome


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how late a transient fault is tried again (``LTM_RETRY_*``)."""

    max_attempts: int = 5
    base_delay_ms: int = 1000
    max_delay_ms: int = 60000
    #: draws the jitter factor between the two bounds (seedable in tests)
    draw: Callable[[float, float], float] = field(default=random.uniform, compare=False)

    def tier_before(self, attempt: int) -> int:
        """The retry queue's nominal delay before ``attempt`` (2 = first retry)."""
        return backoff_tier(self.base_delay_ms, self.max_delay_ms, attempt)

    def delay_before(self, attempt: int) -> int:
        """The tier's delay with jitter (75-100 %), so a burst of failures does not come back as one."""
        return max(1, int(self.tier_before(attempt) * self.draw(0.75, 1.0)))


@dataclass(frozen=True, slots=True)
class Retry:
    """Park the delivery in the retry queue of ``tier_ms`` for ``delay_ms``, counting ``attempts`` made."""

    tier_ms: int
    delay_ms: int
    attempts: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Copy the delivery to the DLQ as ``kind``; answer the shard with ``failure`` when there is one."""

    kind: DeadLetterKind
    attempts: int
    failure: outcome.Outcome | None


def route_failure(
    exc: BaseException, attempt: int, *, committed: bool, policy: RetryPolicy
) -> Retry | DeadLetter:
    """Where attempt number ``attempt`` of an event goes after ``exc``.

    A bug is dead-lettered at once as ``internal``; a transient fault is retried until ``max_attempts``,
    then dead-lettered as ``transient_exhausted``. A failure result goes with the dead letter only when
    the event's outcome did not commit (``committed``): otherwise the stored answer stands, and a replay
    re-emits it.
    """
    if not is_transient(exc):
        failure = None if committed else outcome.internal_error(DeadLetterKind.INTERNAL)
        return DeadLetter(DeadLetterKind.INTERNAL, attempt, failure)
    if attempt >= policy.max_attempts:
        return DeadLetter(
            DeadLetterKind.TRANSIENT_EXHAUSTED, attempt, None if committed else outcome.database_error()
        )
    return Retry(policy.tier_before(attempt + 1), policy.delay_before(attempt + 1), attempt)


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
