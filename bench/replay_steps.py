"""Where the time of a paced ``worker dlq replay`` goes (``python -m bench replay``, its third scenario), and
the figures' small helpers.

The replay runs in the bench's own process the way ``worker dlq replay --rate R`` runs it (``replay_command``
with its audit record), each step of a round timed by a wrapper put around it for the run and taken off
after: taking the round's letters from the DLQ (one ``basic.get`` each), asking the record whether an earlier
replay sent them, the pace's wait, recording them ``pending``, publishing them and waiting for the broker's
confirms, recording them ``replayed``, acking the originals; and the heartbeat, a task of its own. What a
round costs beyond the pace's wait is what keeps a replay from its rate.
"""

from __future__ import annotations

import io
import itertools
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from bench.flood import percentile
from worker.config import Topology
from worker.ops.dlq import replaying
from worker.ops.dlq.audit import Operation
from worker.ops.dlq.audited import Audited
from worker.ops.dlq.commands import replay_command
from worker.ops.dlq.console import Console
from worker.ops.dlq.selection import Selection
from worker.ops.dlq.sweep import Sweep

TOLERANCE = 0.10

#: (what the step is, where it lives, its name there), in a round's order
STEPS: tuple[tuple[str, Any, str], ...] = (
    ("take from the DLQ (basic.get each)", Sweep, "next_batch"),
    ("ask the record: sent before?", Operation, "sent_before"),
    ("the pace's wait", replaying.Pace, "take"),
    ("record them pending", Operation, "taking"),
    ("publish, wait for the confirms", replaying, "_republish"),
    ("record the outcome", Operation, "settled"),
    ("ack the originals", Sweep, "remove"),
    ("heartbeat (a task of its own)", Operation, "beat"),
)


def spread(ms: Sequence[float]) -> str:
    """``n 100, ms p50 12 p99 40 max 41``: latencies (or periods) in milliseconds."""
    if not ms:
        return "n 0"
    return f"n {len(ms)}, ms p50 {percentile(list(ms), 0.5):.0f} p99 {percentile(list(ms), 0.99):.0f} " + (
        f"max {max(ms):.0f}"
    )


def against_target(seconds: float, letters: int, rate: float, tolerance: float = TOLERANCE) -> str:
    """``15.4 s against 15.0 s (3000 at 200/s): +2.7%, within ±10%`` (or by how much it is outside)."""
    expected = letters / rate
    off = seconds / expected - 1
    line = f"{seconds:.1f} s against {expected:.1f} s ({letters} at {rate:g}/s): {off:+.1%}"
    if abs(off) <= tolerance:
        return f"{line}, within ±{tolerance:.0%}"
    bound = expected * (1 + tolerance if off > 0 else 1 - tolerance)
    return f"{line}, outside ±{tolerance:.0%} by {abs(seconds - bound):.1f} s"


def periods(stamps: Sequence[datetime]) -> list[float]:
    """Milliseconds between successive distinct times (a round's letters are settled in one statement, so
    they share its time): the rounds' period."""
    return [(b - a).total_seconds() * 1000 for a, b in itertools.pairwise(sorted(set(stamps)))]


async def on_record(dsn: str, actor: str) -> tuple[float, list[float]]:
    """The latest operation by ``actor``: its own time on record (start to finish, s), and its rounds'
    periods (ms)."""
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            "SELECT operation_id, started_at, finished_at FROM ltm_dlq_operations WHERE actor = $1"
            " ORDER BY started_at DESC LIMIT 1",
            actor,
        )
        stamps = await conn.fetch(
            "SELECT recorded_at FROM ltm_dlq_operation_letters WHERE operation_id = $1"
            " AND outcome = 'replayed'",
            row["operation_id"],
        )
    finally:
        await conn.close()
    took = (row["finished_at"] - row["started_at"]).total_seconds() if row and row["finished_at"] else -1.0
    return took, periods([r["recorded_at"] for r in stamps])


def exactly_once(ids: Sequence[str], copies: Mapping[str, int]) -> tuple[int, int]:
    """How many of ``ids`` have no copy, and how many more than one."""
    return sum(copies.get(i, 0) == 0 for i in ids), sum(copies.get(i, 0) > 1 for i in ids)


@dataclass
class Clock:
    """Each step's calls (seconds each), and when the first began and the last ended (perf_counter)."""

    took: dict[str, list[float]] = field(default_factory=dict)
    first: float | None = None
    last: float | None = None

    def add(self, step: str, began: float, ended: float) -> None:
        self.took.setdefault(step, []).append(ended - began)
        if step == STEPS[-1][0]:
            return  # the heartbeat runs beside the rounds, before and after them too
        self.first = began if self.first is None else min(self.first, began)
        self.last = ended if self.last is None else max(self.last, ended)

    def table(self, wall: float) -> list[str]:
        """One line a step: calls, seconds in all, the share of ``wall``, ms a call (p50, p99), and the p50 of
        its first and of its last tenth of calls (a step that grows as the replay goes on)."""
        head = ("step", "calls", "total s", "share", "p50 ms", "p99 ms", "first 10%", "last 10%")
        lines = [f"{head[0]:<36}" + "".join(f"{h:>10}" for h in head[1:])]
        for step, _, _ in STEPS:
            took = self.took.get(step, [])
            if not took:
                continue
            ms = [s * 1000 for s in took]
            tenth = max(1, len(ms) // 10)
            cells = (
                f"{len(took)}", f"{sum(took):.2f}", f"{sum(took) / wall:.0%}", f"{percentile(ms, 0.5):.1f}",
                f"{percentile(ms, 0.99):.1f}", f"{percentile(ms[:tenth], 0.5):.1f}",
                f"{percentile(ms[-tenth:], 0.5):.1f}",
            )  # fmt: skip
            lines.append(f"{step:<36}" + "".join(f"{cell:>10}" for cell in cells))
        return lines


def _timed(clock: Clock, step: str, work: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def timed(*args: Any, **kwargs: Any) -> Any:
        if any(isinstance(arg, list | tuple) and not arg for arg in args):
            return await work(*args, **kwargs)  # nothing to do (no letter refused): not a step's cost
        began = time.perf_counter()
        try:
            return await work(*args, **kwargs)
        finally:
            clock.add(step, began, time.perf_counter())

    return timed


@contextmanager
def steps_timed(clock: Clock) -> Iterator[None]:
    """Every step of :data:`STEPS` timed into ``clock`` while inside; as it was after."""
    originals = [(owner, name, getattr(owner, name)) for _, owner, name in STEPS]
    try:
        for (step, _, _), (owner, name, work) in zip(STEPS, originals, strict=True):
            setattr(owner, name, _timed(clock, step, work))
        yield
    finally:
        for owner, name, work in originals:
            setattr(owner, name, work)


async def where_the_time_goes(url: str, dsn: str, letters: int, rate: float) -> list[str]:
    """Replay the DLQ at ``rate`` in this process with each step timed; what to print."""
    clock, out = Clock(), io.StringIO()
    quiet = Console(out=out, err=io.StringIO())
    with steps_timed(clock):
        began = time.perf_counter()
        code = await replay_command(
            url, Topology(), Selection(), audit=Audited(dsn, "bench-steps"), console=quiet, rate=rate
        )
        ended = time.perf_counter()
    wall = ended - began
    rounds = len(clock.took.get(STEPS[4][0], []))
    before = (clock.first or began) - began
    after = ended - (clock.last or ended)
    said = out.getvalue().strip().splitlines()
    return [
        f"   replayed in this process (exit {code}: {said[-1] if said else '-'}): "
        f"{against_target(wall, letters, rate)}",
        f"   {rounds} rounds; {before:.2f} s before the first step (the record, the DLQ's depth), "
        f"{after:.2f} s after the last (the acks' grace, the record closed)",
        *(f"   {line}" for line in clock.table(wall)),
    ]
