"""The retention (``LTM_DLQ_RETENTION``): ``worker dlq expire`` removes from the DLQ every dead letter that
failed longer ago, as a purge does but on record as ``expired``, then deletes from ``ltm_dead_letters`` the
rows of letters that failed longer ago and are no longer waiting; and :class:`RetentionSweeps` runs it beside
``worker run`` every ``LTM_DLQ_RETENTION_SWEEP``.

The sweeps of a fleet need no leader: before each, a worker reads the record, and skips while an ``expire``
of its DLQ ran (or runs) within the interval; an expire runs alone on its DLQ (``running.in_the_way``), so two
workers that look at once cannot both sweep: the second is refused and looks again later.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import random
from collections.abc import Callable
from datetime import timedelta

import structlog

from worker.broker.urls import vhost_of
from worker.config import Settings, Topology, duration_seconds
from worker.ops.dlq.audit import Audit, Operation
from worker.ops.dlq.audited import Audited, Ending
from worker.ops.dlq.console import EXIT_BUSY, EXIT_OK, Console
from worker.ops.dlq.operations import StopFn, Totals, purge
from worker.ops.dlq.record import KEPT, OPERATIONS
from worker.ops.dlq.render import Progress
from worker.ops.dlq.selection import Selection
from worker.ops.dlq.sweep import DEFAULT_BATCH, open_dead_letters
from worker.redact import describe

log = structlog.get_logger("worker.retention")

#: who the workers' sweeps are on record as
SWEEPER = "retention"
#: a worker's first look comes after half to all of this (or of the interval, if shorter): a fleet started at
#: once does not look at once, and a run of a few minutes (a test, a demo) is not swept under
FIRST_LOOK_SECONDS = 600.0
#: the least time between two looks of one worker, whatever came of the first (refused, failed)
AGAIN_SECONDS = 300.0
#: how long a worker that stops waits for its sweep to settle the batch in hand
STOP_SECONDS = 10.0

#: SQL: delete the kept rows of letters that failed (or, with no failure time, were kept) longer ago than
#: ``$1`` seconds and are no longer waiting; how many of each state
_FORGET = f"""
WITH gone AS (
    DELETE FROM {KEPT}
    WHERE state <> 'waiting' AND least(failed_at, kept_at) < now() - make_interval(secs => $1)
    RETURNING state
)
SELECT state, count(*)::int AS n FROM gone GROUP BY state ORDER BY state
"""


async def forget(audit: Audit, seconds: float) -> dict[str, int]:
    """Delete the kept rows past the retention that are no longer waiting; how many, by state."""
    rows = await audit.query(_FORGET, float(seconds))
    return {row["state"]: row["n"] for row in rows}


def forgotten(removed: dict[str, int]) -> str:
    """``removed 3 kept rows (expired 2, replayed 1)``."""
    total = sum(removed.values())
    counted = ", ".join(f"{state} {n}" for state, n in sorted(removed.items()))
    return f"removed {total} kept row(s) from {KEPT}" + (f" ({counted})" if counted else "")


async def expire_command(
    url: str,
    topology: Topology,
    retention: str,
    *,
    audit: Audited,
    batch: int = DEFAULT_BATCH,
    progress: bool = False,
    console: Console | None = None,
    stop: StopFn | None = None,
) -> int:
    """``worker dlq expire``: remove the dead letters that failed longer than ``retention`` (``14d``) ago from
    the DLQ (on record as ``expired``), then the rows past it from ``ltm_dead_letters`` (the retention's own
    letters among them); exit 6 when another operation of the DLQ runs."""
    console = console or Console()
    seconds = duration_seconds(retention)
    selection = Selection(older_than=timedelta(seconds=seconds))
    outcome: Totals | None = None
    note: str | None = None
    live = console.err.isatty()
    meter = Progress("expire", console.err, live=live) if live or progress else None

    async def run(journal: Operation) -> int:
        nonlocal outcome, note
        async with open_dead_letters(url, topology) as dlq:
            try:
                outcome = await purge(
                    dlq, selection, batch=batch, progress=meter, journal=journal, stop=stop, outcome="expired"
                )
            finally:
                if meter is not None:
                    meter.finish()
        removed = forgotten(await forget(journal.audit, seconds))
        note = f"expired {outcome.removed} dead letter(s) older than {retention}; {removed}"
        console.out.write(f"{note}; kept {outcome.kept} in {topology.dead_letter_queue}\n")
        return EXIT_OK

    def ending() -> Ending:
        return outcome, note, None

    return await audit.perform("expire", (selection, url, topology), console, run, ending, stop=stop)


async def since_last_sweep(dsn: str, url: str, topology: Topology) -> float | None:
    """Seconds since the latest ``expire`` of the DLQ that ran to its end (or runs now) started; None when
    there was none."""
    async with Audit.opened(dsn) as audit:
        rows = await audit.query(
            f"SELECT extract(epoch FROM now() - max(started_at))::float8 AS since FROM {OPERATIONS}"
            " WHERE action = 'expire' AND vhost = $1 AND queue = $2 AND state IN ('started', 'done')",
            vhost_of(url),
            topology.dead_letter_queue,
        )
    since = rows[0]["since"] if rows else None
    return None if since is None else float(since)


class RetentionSweeps:
    """``worker run``'s retention sweep: every ``LTM_DLQ_RETENTION_SWEEP``, one worker of the fleet runs
    ``worker dlq expire`` as :data:`SWEEPER`; nothing it meets (Postgres or RabbitMQ down, another operation
    running) stops the worker, it is logged and looked at again later."""

    def __init__(self, settings: Settings, *, rng: Callable[[float, float], float] = random.uniform) -> None:
        self._settings = settings
        self._every = float(settings.dlq_retention_sweep_seconds)
        self._rng = rng
        self._stopped = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._every > 0:
            self._task = asyncio.get_running_loop().create_task(self._sweeps(), name="retention")

    async def stop(self) -> None:
        """Stop looking; a sweep under way stops after the batch in hand (what it holds goes back)."""
        self._stopped.set()
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
            await asyncio.wait_for(asyncio.shield(self._task), STOP_SECONDS)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task

    async def _sweeps(self) -> None:
        pause = self._rng(0.5, 1.0) * min(self._every, FIRST_LOOK_SECONDS)
        while not await self._rested(pause):
            pause = await self._look()

    async def _rested(self, seconds: float) -> bool:
        """Wait ``seconds``, or until the worker stops; whether it does."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), seconds)
        return self._stopped.is_set()

    async def _look(self) -> float:
        """Sweep if it is due; how long to wait before the next look."""
        settings = self._settings
        again = min(self._every, AGAIN_SECONDS)
        try:
            since = await since_last_sweep(settings.postgres_dsn, settings.rabbitmq_url, settings.topology)
        except Exception as exc:
            log.warning("retention sweep: cannot read the record", error=describe(exc), retry_in_s=again)
            return again
        if since is not None and since < self._every:
            return self._every - since + self._rng(0.0, min(self._every / 10, 60.0))
        said = io.StringIO()
        code = await expire_command(
            settings.rabbitmq_url,
            settings.topology,
            settings.dlq_retention,
            audit=Audited(settings.postgres_dsn, SWEEPER),
            console=Console(out=said, err=said),
            stop=self._stopped.is_set,
        )
        lines = said.getvalue().strip()
        if code == EXIT_OK:
            log.info("retention sweep", result=lines, retention=settings.dlq_retention)
        elif code == EXIT_BUSY:
            log.info("retention sweep skipped: another operation runs on the DLQ", result=lines)
        else:
            log.warning("retention sweep failed", exit_code=code, result=lines, retry_in_s=again)
        return max(again, 0.0)
