"""Hand Postgres the events that are ready together.

Each delivery calls :meth:`Batcher.process` and awaits its own answer. When no batch is at Postgres, an
event starts one at once (a quiet worker adds no latency: a batch of one). While one is, the events that
arrive wait for it to come back and then leave together (up to ``max_batch``): two round trips and one
commit for the lot instead of each (:func:`~worker.service.process.process_batch`). The busier the
worker, the larger the batches. Another connection (up to ``max_running``) is only taken when half a
batch is already waiting (a deep queue), when an event has waited ``max_wait`` (10 ms) for the batch
at Postgres to come back (a slow commit, a lock wait), or for the only event of its shard here: a quiet
shard's event does not wait behind a loud shard's batches (docs/fair-shares.md).

A batch that fails is not the events' verdict: its events are processed again one by one, so an event
that breaks (a bug, a constraint) fails alone and its neighbours are answered. Every guarantee of one
event holds for a batch: the limit is counted under the scope lock, event ids are claimed once, and
nothing is written unless all of the batch commits.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import asyncpg

from contracts.models import ToolCallEvent
from worker.pipeline.limits import MemoryLimits
from worker.service.process import ProcessedEvent, process_batch, utcnow


@dataclass(slots=True)
class _Job:
    event: ToolCallEvent
    attempts: int
    answer: asyncio.Future[ProcessedEvent] = field(repr=False)


class Batcher:
    """Batches concurrent :meth:`process` calls onto at most ``max_running`` connections at a time."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        limits: MemoryLimits,
        *,
        max_running: int,
        max_batch: int,
        on_batch: Callable[[int], None] | None = None,
        max_wait: float = 0.01,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        if max_running < 1 or max_batch < 1:
            raise ValueError("max_running and max_batch must be at least 1")
        self._pool = pool
        self._limits = limits
        self._max_running = max_running
        self._max_batch = max_batch
        self._fill = max(1, max_batch // 2)
        self._max_wait = max_wait
        self._overdue: asyncio.TimerHandle | None = None
        self._clock = clock
        self._waiting: list[_Job] = []
        self._running: set[asyncio.Task[None]] = set()
        #: events in the batcher (waiting or at Postgres) by shard
        self._shards: dict[int, int] = {}
        self._on_batch = on_batch

    async def process(self, event: ToolCallEvent, attempts: int = 1) -> ProcessedEvent:
        """Process ``event`` exactly once, alone or with others; see :func:`process_batch`.

        Cancelling the caller abandons the answer, not the write: a batch already at Postgres commits,
        and a redelivery of the event is answered from the ledger.
        """
        job = _Job(event, attempts, asyncio.get_running_loop().create_future())
        shard = event.shard_id
        fresh = shard not in self._shards
        self._shards[shard] = self._shards.get(shard, 0) + 1
        try:
            if fresh and self._running and len(self._running) < self._max_running:
                # the shard's only event here, beside batches of others: it goes to Postgres at once, alone,
                # rather than wait behind a loud shard's batch (docs/fair-shares.md)
                self._launch([job])
            else:
                self._waiting.append(job)
                self._start()
            return await job.answer
        finally:
            left = self._shards[shard] - 1
            if left:
                self._shards[shard] = left
            else:
                del self._shards[shard]

    @property
    def running(self) -> int:
        """Batches at Postgres now."""
        return len(self._running)

    async def abandon(self, timeout: float) -> int:
        """Give up on every event waiting or at Postgres: their callers get ``CancelledError``, the running
        batches are cancelled (a batch whose commit already went through stays committed), and this waits
        up to ``timeout`` seconds for them to end. Returns how many are still running: their connections
        hang (a Postgres that does not answer the cancel), and only closing them ends the batches."""
        self._cancel_overdue()
        for job in self._waiting:
            job.answer.cancel()
        self._waiting.clear()
        for task in self._running:
            task.cancel()
        if self._running and timeout > 0:
            await asyncio.wait(set(self._running), timeout=timeout)
        return len(self._running)

    def _start(self, *, overdue: bool = False) -> None:
        if overdue:
            self._overdue = None
        while self._waiting and len(self._running) < self._max_running:
            if self._running and len(self._waiting) < self._fill and not overdue:
                # a batch is at Postgres: let the next one fill up while it works; another connection
                # is only worth it for a queue this deep, or once the first waiter has waited max_wait
                # (a batch slow to come back)
                if self._overdue is None:
                    self._overdue = asyncio.get_running_loop().call_later(
                        self._max_wait, lambda: self._start(overdue=True)
                    )
                return
            overdue = False
            batch = [job for job in self._waiting[: self._max_batch] if not job.answer.done()]
            del self._waiting[: self._max_batch]
            if batch:
                self._launch(batch)

    def _launch(self, batch: list[_Job]) -> None:
        # a batch serves several events: it must not inherit the log fields and span of the one whose
        # arrival started it (an empty context)
        task = asyncio.create_task(self._run(batch), context=contextvars.Context())
        self._running.add(task)
        task.add_done_callback(self._finished)

    def _cancel_overdue(self) -> None:
        if self._overdue is not None:
            self._overdue.cancel()
            self._overdue = None

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._cancel_overdue()
        self._start()

    async def _run(self, batch: list[_Job]) -> None:
        try:
            if self._on_batch is not None:
                self._on_batch(len(batch))
            try:
                answers = await process_batch(
                    self._pool, [(job.event, job.attempts) for job in batch], self._limits, clock=self._clock
                )
            except Exception as exc:
                if len(batch) == 1:
                    _resolve(batch[0], exc)
                    return
                # one by one, side by side: an event that breaks fails alone
                alone = await asyncio.gather(
                    *(
                        process_batch(
                            self._pool, [(job.event, job.attempts)], self._limits, clock=self._clock
                        )
                        for job in batch
                    ),
                    return_exceptions=True,
                )
                for job, got in zip(batch, alone, strict=True):
                    _resolve(job, got if isinstance(got, BaseException) else got[0])
                return
            for job, answer in zip(batch, answers, strict=True):
                _resolve(job, answer)
        except BaseException:
            for job in batch:
                job.answer.cancel()
            raise


def _resolve(job: _Job, got: ProcessedEvent | BaseException) -> None:
    if job.answer.done():  # the caller gave up (cancelled)
        return
    if isinstance(got, asyncio.CancelledError):
        job.answer.cancel()
    elif isinstance(got, BaseException):
        job.answer.set_exception(got)
    else:
        job.answer.set_result(got)
