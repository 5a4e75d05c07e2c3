"""Who is loud, without Prometheus: what each worker saw of each shard, written to Postgres every few seconds.

:class:`ShardActivity` counts, per shard, the events that reached this worker, the events it answered and
their waits (publish to the start of processing, in the buckets of ``ltm_shard_wait_seconds``), and knows
how many it holds now. :class:`ActivityRecorder` writes one row per shard with anything to say to
``ltm_shard_activity`` every ``LTM_METRICS_INTERVAL_SECONDS`` (migration 0009) and removes rows older than an
hour; ``worker shards`` (:mod:`worker.ops.shards`) adds up the rows of every worker.
"""

from __future__ import annotations

import asyncio
import bisect
import os
import secrets
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import asyncpg
import structlog

from worker.aio import cancel_within, finish_within
from worker.redact import describe
from worker.store.repository import ActivityRow, forget_shard_activity, write_shard_activity

log = structlog.get_logger("worker")
#: the row of every shard without a queue of its own (``other`` in the metrics and in ``worker shards``): the
#: rows stay as bounded as the shard queues' cap, whatever shard ids events name
OTHER_SHARD = -1
#: how long a stop waits for the recorder's task, and then for its last write
CLOSE_SECONDS = 2.0


@dataclass(slots=True)
class _Counts:
    received: int = 0
    answered: int = 0
    waits: list[int] = field(default_factory=list)


class ShardActivity:
    """Per-shard counts since the last :meth:`take` (the held events: as of now)."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self._counts: dict[int, _Counts] = {}
        self._held: dict[int, int] = {}

    def _of(self, shard_id: int) -> _Counts:
        counts = self._counts.get(shard_id)
        if counts is None:
            counts = self._counts[shard_id] = _Counts(waits=[0] * (len(self.buckets) + 1))
        return counts

    def received(self, shard_id: int) -> None:
        self._of(shard_id).received += 1

    def answered(self, shard_id: int) -> None:
        self._of(shard_id).answered += 1

    def waited(self, shard_id: int, seconds: float) -> None:
        self._of(shard_id).waits[bisect.bisect_left(self.buckets, seconds)] += 1

    def held(self, shard_id: int, count: int) -> None:
        if count:
            self._held[shard_id] = count
        else:
            self._held.pop(shard_id, None)

    def take(self) -> list[ActivityRow]:
        """One row per shard with events counted or held; the counts start again from zero."""
        counts, self._counts = self._counts, {}
        rows = []
        for shard_id in sorted(set(counts) | set(self._held)):
            got = counts.get(shard_id) or _Counts(waits=[0] * (len(self.buckets) + 1))
            rows.append(
                ActivityRow(shard_id, got.received, got.answered, self._held.get(shard_id, 0), got.waits)
            )
        return rows


def worker_name() -> str:
    """A worker in ``ltm_shard_activity``: host, pid and a token (two workers in one process are two)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class ActivityRecorder:
    """Writes ``activity`` to Postgres every ``interval`` seconds until closed (and once more then)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        activity: ShardActivity,
        interval: float,
        *,
        name: Callable[[], str] = worker_name,
    ) -> None:
        self._pool = pool
        self._activity = activity
        self._interval = interval
        self._name = name()
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    async def close(self) -> None:
        """Stop writing, then write once more: each step bounded (a write stuck on a Postgres that does not
        answer would otherwise hold the stop; its connection is terminated when the pool closes)."""
        if self._task is not None and not await cancel_within(self._task, CLOSE_SECONDS):
            return  # the last write is stuck: a new one would be too
        await finish_within(self.write(), CLOSE_SECONDS)

    async def write(self) -> None:
        rows = self._activity.take()
        if rows:
            await write_shard_activity(self._pool, self._name, rows)
        await forget_shard_activity(self._pool)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.write()
            except Exception as exc:  # Postgres away: this interval's counts are lost, not the worker
                if not self._failing:
                    log.warning("could not record the shards' activity", error=describe(exc))
                self._failing = True
            else:
                self._failing = False
