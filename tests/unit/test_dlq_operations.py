"""A replay as an operation, the parts that need no broker: its pace, its progress line, what a busy DLQ, a
second Ctrl-C and ``worker dlq operations`` say, and how a first Ctrl-C leaves the command running."""

from __future__ import annotations

import asyncio
import io
import time
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from worker.ops.dlq.audit import Operation
from worker.ops.dlq.cli import Interruption, _in_doubt
from worker.ops.dlq.live import operations_header, operations_line
from worker.ops.dlq.render import Progress
from worker.ops.dlq.replaying import DEFAULT_RATE, Pace
from worker.ops.dlq.running import Busy, in_the_way


def test_a_pace_takes_a_tenth_of_a_second_of_its_rate_a_round() -> None:
    assert Pace(200).batch(1000) == 20
    assert Pace(DEFAULT_RATE).batch(1000) == 5
    assert Pace(3).batch(1000) == 1  # never less than one letter
    assert Pace(50_000).batch(1000) == 1000  # never more than --batch
    with pytest.raises(ValueError, match="rate must be positive"):
        Pace(0)


async def test_a_pace_never_goes_faster_than_its_rate() -> None:
    pace = Pace(100)
    began = time.monotonic()
    for _ in range(6):
        assert await pace.take(10, lambda: False)
    # the first ten go at once, each next ten a tenth of a second after: five waits
    assert time.monotonic() - began >= 0.5


async def test_a_pace_that_fell_behind_does_not_catch_up_in_a_burst(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    waits: list[float] = []

    async def sleep(seconds: float) -> None:  # the clock moves only by what the pace waits
        waits.append(seconds)
        now[0] += seconds

    monkeypatch.setattr(asyncio, "sleep", sleep)
    pace = Pace(10, clock=lambda: now[0])
    assert await pace.take(1, lambda: False)
    now[0] = 60.0  # a minute stuck (a slow broker): 600 letters' worth of time went by
    for _ in range(3):
        assert await pace.take(1, lambda: False)
    # at most one round goes early (the tenth of a second a replay may fall behind), then the rate holds:
    # the 600 letters it "saved" do not go in a burst
    assert waits == [pytest.approx(0.1)]


async def test_a_pace_waiting_stops_when_asked() -> None:
    pace = Pace(1)
    assert await pace.take(1, lambda: False)
    began = time.monotonic()
    asked = iter([False, False, True])
    assert not await pace.take(1, lambda: next(asked))
    assert time.monotonic() - began < 0.9  # it did not sit out the whole second


def test_a_paced_replays_progress_names_its_rate_and_what_is_left() -> None:
    out = io.StringIO()
    progress = Progress("replay", out, live=False, rate=50)
    sweep = SimpleNamespace(scanned=500, expected=3000, removed=480)
    progress(sweep)  # type: ignore[arg-type]
    progress(sweep)  # type: ignore[arg-type]  # within the second: not printed again
    assert out.getvalue() == "replay: 500/3000 scanned, 480 moved (50/s, 50 s left at most)\n"


def _holder(**row: Any) -> dict[str, Any]:
    return {
        "operation_id": uuid.UUID("00000000-0000-4000-8000-000000000001"),
        "actor": "alice@ops",
        "queue": "ltm.create_memory.dlq",
        "started_at": datetime(2026, 12, 6, 9, 0, tzinfo=UTC),
        "moved": 120,
        "selected": 130,
        "rate": 50.0,
        **row,
    }


def test_a_busy_dlq_names_the_replay_that_runs_and_how_to_stop_it() -> None:
    text = str(Busy(_holder()))
    assert text == (
        "operation 00000000-0000-4000-8000-000000000001 by alice@ops is replaying ltm.create_memory.dlq "
        "since 2026-12-06T09:00:00.000Z (120 moved of 130 selected so far, at 50/s); one replay per DLQ at a "
        "time: wait for it, or stop it with `worker dlq cancel 00000000-0000-4000-8000-000000000001`"
    )
    assert "as fast as the broker confirms" in str(Busy(_holder(rate=None, moved=None, selected=None)))


def test_operations_prints_one_line_a_replay_under_its_header() -> None:
    row = {
        "operation_id": "00000000-0000-4000-8000-000000000001",
        "action": "replay",
        "state": "running",
        "rate": 50.0,
        "moved": 120,
        "selected": 130,
        "scanned": 140,
        "expected": 3000,
        "started_at": "2026-12-06T09:00:00Z",
        "heartbeat_at": "2026-12-06T09:00:03Z",
        "actor": "alice@ops",
        "cancelled_by": "bob\x1b[2J",
    }
    line = operations_line(row)
    assert line.split()[:3] == ["00000000-0000-4000-8000-000000000001", "replay", "running"]
    assert line.split()[3:6] == ["50/s", "120/130", "140/3000"]
    assert "\x1b" not in line  # a name from the record cannot act on the terminal
    assert operations_header().split()[:4] == ["OPERATION", "ACTION", "STATE", "RATE"]


def test_a_second_ctrl_c_says_how_many_letters_are_in_doubt_and_how_to_find_them() -> None:
    operation = Operation(audit=None, id=uuid.UUID(int=7), action="replay")  # type: ignore[arg-type]
    operation.outcomes["pending"] = 20
    said = _in_doubt(operation)
    assert said.startswith("stopped at once: 20 dead letter(s) in doubt")
    assert f"`worker dlq history --operation {uuid.UUID(int=7)}`" in said
    assert "running the same replay again finishes it without sending a letter twice" in said
    operation.outcomes["pending"] = 0
    assert "no dead letter in doubt" in _in_doubt(operation)


async def test_a_first_ctrl_c_of_a_replay_lets_the_command_run_on_to_its_next_round() -> None:
    interruption = Interruption(graceful=True)
    rounds: list[int] = []

    async def command(stop: Any) -> int:
        for n in range(5):
            await asyncio.sleep(0.01)
            if stop():
                raise asyncio.CancelledError("interrupted")
            rounds.append(n)
            if n == 1:
                interruption.interrupt()  # Ctrl-C while round 1 is in flight: it is not cut short
        return 0

    assert await interruption.run(command) == 130
    assert rounds == [0, 1]
    with pytest.raises(KeyboardInterrupt):
        interruption.interrupt()  # the second stops at once


@pytest.mark.parametrize(
    ("action", "running", "refused"),
    [
        ("replay", ["replay"], True),
        ("replay", ["purge"], False),
        ("purge", ["purge", "replay"], False),
        ("expire", ["purge"], True),
        ("repair", ["replay"], True),
        ("replay", ["expire"], True),
        ("purge", ["repair"], True),
        ("expire", ["expire"], True),
        ("expire", [], False),
    ],
)
def test_one_replay_at_a_time_and_an_expire_or_repair_alone(
    action: str, running: list[str], refused: bool
) -> None:
    rows = [_holder(action=held) for held in running]
    assert (in_the_way(action, rows) is not None) == refused


def test_a_busy_dlq_says_what_runs_and_that_an_expire_ends_on_its_own() -> None:
    text = str(Busy(_holder(action="expire", actor="retention", rate=None), "replay"))
    assert text.startswith(
        "operation 00000000-0000-4000-8000-000000000001 by retention is expiring letters of "
    )
    assert text.endswith("an expire or repair runs alone on its DLQ: wait for it (it ends on its own)")
