"""Who is loud, without Prometheus: what each worker saw of each shard, written to Postgres every few seconds.

:class:`ShardActivity` counts, per shard, the events that reached this worker, the events it answered and
their waits (publish to the start of processing, in the buckets of ``ltm_shard_wait_seconds``), and knows
how many it holds now; and inside each shard, per guild, the events in, held and moved, of which each row
keeps the shard's loudest :data:`LOUDEST_GUILDS` (no metric label per guild: guild ids would explode the
series). :class:`ActivityRecorder` writes one row per shard with anything to say to
``ltm_shard_activity`` every ``LTM_METRICS_INTERVAL_SECONDS`` (migration 0009) and removes rows older than an
hour; ``worker shards`` (:mod:`worker.ops.shards_report`) adds up the rows of every worker.
"""

from __future__ import annotations

import asyncio
import bisect
import os
import secrets
import socket
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import asyncpg
import structlog

from worker.aio import cancel_within, finish_within
from worker.redact import describe
from worker.store.activity import ActivityRow, GuildActivity, forget_shard_activity, write_shard_activity

log = structlog.get_logger("worker")
#: the row of every shard without a queue of its own (``other`` in the metrics and in ``worker shards``): the
#: rows stay as bounded as the shard queues' cap, whatever shard ids events name
OTHER_SHARD = -1
#: the guilds of a shard each activity row names, loudest first (held, then in, then moved)
LOUDEST_GUILDS = 5
#: how long a stop waits for the recorder's task, and then for its last write
CLOSE_SECONDS = 2.0


@dataclass(slots=True)
class _Counts:
    received: int = 0
    answered: int = 0
    waits: list[int] = field(default_factory=list)
    #: per guild: events in and moved
    guild_received: Counter[str] = field(default_factory=Counter)
    guild_moved: Counter[str] = field(default_factory=Counter)


class ShardActivity:
    """Per-shard counts since the last :meth:`take` (the held events: as of now)."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self._counts: dict[int, _Counts] = {}
        self._held: dict[int, int] = {}
        #: per shard, the events each guild holds now (guilds holding none left out)
        self._guild_held: dict[int, dict[str, int]] = {}

    def _of(self, shard_id: int) -> _Counts:
        counts = self._counts.get(shard_id)
        if counts is None:
            counts = self._counts[shard_id] = _Counts(waits=[0] * (len(self.buckets) + 1))
        return counts

    def received(self, shard_id: int, guild: str | None = None) -> None:
        counts = self._of(shard_id)
        counts.received += 1
        if guild is not None:
            counts.guild_received[guild] += 1

    def moved(self, shard_id: int, guild: str) -> None:
        self._of(shard_id).guild_moved[guild] += 1

    def guild_held(self, shard_id: int, guild: str, count: int) -> None:
        held = self._guild_held.setdefault(shard_id, {})
        if count:
            held[guild] = count
        else:
            held.pop(guild, None)
            if not held:
                del self._guild_held[shard_id]

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
                ActivityRow(
                    shard_id,
                    got.received,
                    got.answered,
                    self._held.get(shard_id, 0),
                    got.waits,
                    self._loudest(shard_id, got),
                )
            )
        return rows

    def _loudest(self, shard_id: int, got: _Counts) -> list[GuildActivity]:
        held = self._guild_held.get(shard_id, {})
        guilds = set(held) | set(got.guild_received) | set(got.guild_moved)
        loudest = sorted(
            guilds, key=lambda g: (-held.get(g, 0), -got.guild_received[g], -got.guild_moved[g], g)
        )[:LOUDEST_GUILDS]
        return [GuildActivity(g, got.guild_received[g], held.get(g, 0), got.guild_moved[g]) for g in loudest]


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
