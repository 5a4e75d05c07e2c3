"""The invalidation outbox: each saved memory's cache invalidation reaches Redis at least once after the
commit, and a Redis outage neither holds events nor sends them round the retry queues.

:meth:`InvalidationOutbox.publish` is called for every invalidation an event emits (after its commit, or
re-emitted from the ledger). While Redis answers, it publishes at once, as before. When Redis does not,
the event's ledger row is marked pending (``invalidation_pending_since``, migration 0005) and the call
returns: the event is answered and acked once the mark is committed, so a crash before that point only
redelivers the event. The outbox's own task then publishes every pending row (this worker's and any other
worker's, oldest first, locked with SKIP LOCKED so workers share the backlog without publishing a row
twice) as soon as Redis answers again, and clears the marks. While it knows Redis is down, new
invalidations go straight to the mark without trying Redis, so no event waits on a dead server.

It also sweeps every ``sweep_seconds`` (pending rows left by a worker that died after marking them).
The backlog is the gauge ``ltm_invalidations_pending``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any
from uuid import UUID

import asyncpg
import redis.exceptions
import structlog

from contracts.models import invalidation_id
from worker.aio import cancel_within
from worker.invalidation.redis import InvalidationPublisher
from worker.redact import describe
from worker.store import repository as repo

log = structlog.get_logger("worker.outbox")

#: how often a worker looks for pending rows when it has no reason to think there are any
SWEEP_SECONDS = 10.0
#: how long a stop waits for the sweep's task to end
CLOSE_SECONDS = 2.0
#: how often it asks Redis whether it is back, while it is down
PROBE_SECONDS = 0.5
#: pending rows published per transaction
SWEEP_BATCH = 500

REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError, TimeoutError)


def wire_invalidation(event_id: UUID, stored: Any) -> Any:
    """The invalidation as CONTRACT.md section 6 has it, from the ledger's copy. A row written before the
    invalidation lost its ``event_id`` (a worker of an earlier version) still holds it: it is replaced by
    the opaque ``invalidation_id`` here, so no ``event_id`` ever reaches the channel every shard reads."""
    if not isinstance(stored, dict) or "event_id" not in stored:
        return stored
    wire = {k: v for k, v in stored.items() if k != "event_id"}
    return {
        "schema_version": wire.pop("schema_version", 1),
        "invalidation_id": invalidation_id(event_id),
        **wire,
    }


class _RedisUnavailable(Exception):
    """Redis did not take the pending invalidations of a sweep."""


class InvalidationOutbox:
    """Publishes invalidations now if Redis answers, else later from their pending mark in Postgres."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        cache: InvalidationPublisher,
        *,
        on_backlog: Callable[[int], None] | None = None,
        on_deferred: Callable[[], None] | None = None,
        sweep_seconds: float = SWEEP_SECONDS,
        probe_seconds: float = PROBE_SECONDS,
    ) -> None:
        self._pool = pool
        self._cache = cache
        self._on_backlog = on_backlog
        self._on_deferred = on_deferred
        self._sweep_seconds = sweep_seconds
        self._probe_seconds = probe_seconds
        self._redis_down = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def redis_down(self) -> bool:
        """True from a failed publish until the outbox has seen Redis answer again."""
        return self._redis_down

    def start(self) -> None:
        """Start publishing pending rows (first sweep at once: rows a stopped worker left behind)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="invalidation-outbox")
            self._wake.set()

    async def close(self) -> None:
        """Stop the task; pending rows stay marked for the next sweep, by any worker. Bounded: a sweep stuck
        on a Postgres that does not answer ends when the pool is terminated, not before the stop goes on."""
        if self._task is not None:
            await cancel_within(self._task, CLOSE_SECONDS)
            self._task = None

    async def publish(self, event_id: UUID, invalidation: dict[str, Any]) -> None:
        """Return once ``invalidation`` is in Redis, or marked pending in Postgres (raises only when
        neither could be done: Postgres failed too, and the event takes the usual transient path)."""
        if not self._redis_down:
            try:
                await self._cache.publish(wire_invalidation(event_id, invalidation))
                return
            except REDIS_DOWN as exc:
                if not self._redis_down:
                    log.warning(
                        "redis unavailable; invalidations are kept in postgres until it answers",
                        error=describe(exc),
                    )
                self._redis_down = True
        async with self._pool.acquire() as conn:
            await repo.defer_invalidations(conn, [event_id])
        if self._on_deferred is not None:
            self._on_deferred()
        self._wake.set()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self._sweep_seconds)
            self._wake.clear()
            try:
                if self._redis_down:
                    await self._wait_for_redis()
                await self._sweep()
            except asyncio.CancelledError:
                raise
            except _RedisUnavailable as exc:
                self._redis_down = True
                log.warning("redis unavailable while publishing pending invalidations", error=str(exc))
                self._wake.set()
            except Exception as exc:  # Postgres down: the rows stay marked; try again at the next sweep
                log.warning(
                    "could not publish pending invalidations; trying again later",
                    error=describe(exc),
                )

    async def _wait_for_redis(self) -> None:
        while True:
            try:
                await self._cache.ping()
            except REDIS_DOWN:
                await asyncio.sleep(self._probe_seconds)
                continue
            return

    async def _publish_pending(self, invalidations: list[Any]) -> None:
        # only Redis's own failures mean "Redis is down": a Postgres connection refused is an OSError too,
        # and taking it for Redis would have the outbox probe a healthy Redis and sweep again at once, in a
        # loop
        try:
            await self._cache.publish_all(invalidations)
        except REDIS_DOWN as exc:
            raise _RedisUnavailable(describe(exc)) from exc

    async def _sweep(self) -> None:
        """Publish every pending row, oldest first, in batches; then report the backlog."""
        published = 0
        async with self._pool.acquire() as conn:
            while True:
                async with conn.transaction():
                    rows = await repo.take_pending_invalidations(conn, SWEEP_BATCH)
                    if rows:
                        await self._publish_pending(
                            [wire_invalidation(event_id, invalidation) for event_id, invalidation in rows]
                        )
                        await repo.clear_invalidations(conn, [event_id for event_id, _ in rows])
                published += len(rows)
                if len(rows) < SWEEP_BATCH:
                    break
            backlog = await repo.count_pending_invalidations(conn)
        if self._redis_down:
            self._redis_down = False
            log.info("redis answers again; pending invalidations published", published=published)
        elif published:
            log.info("pending invalidations published", published=published)
        if self._on_backlog is not None:
            self._on_backlog(backlog)
