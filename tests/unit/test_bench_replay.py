"""``python -m bench replay``'s summary helpers (bench/replay_steps.py): what it prints about a replay's time
against its rate, the rounds' period, exactly once, and the steps it times (no figure is asserted here: the
bench prints them)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import cast

from bench.replay import parser
from bench.replay_steps import STEPS, Clock, against_target, exactly_once, periods, spread, steps_timed
from worker.ops.dlq.audit import Operation
from worker.ops.dlq.replaying import Pace


def test_against_target_says_within_or_by_how_much_outside() -> None:
    assert against_target(15.4, 3000, 200) == "15.4 s against 15.0 s (3000 at 200/s): +2.7%, within ±10%"
    assert against_target(13.6, 3000, 200).endswith("-9.3%, within ±10%")
    # 22.6 s is 6.1 s past the tolerance's 16.5 s; 12 s is 1.5 s short of its 13.5 s
    assert against_target(22.6, 3000, 200).endswith("+50.7%, outside ±10% by 6.1 s")
    assert against_target(12.0, 3000, 200).endswith("-20.0%, outside ±10% by 1.5 s")
    assert against_target(2.0, 200, 100, tolerance=0.5).endswith("+0.0%, within ±50%")


def test_spread_gives_count_median_p99_and_max() -> None:
    assert spread([]) == "n 0"
    assert spread([10.0, 30.0, 20.0]) == "n 3, ms p50 20 p99 30 max 30"
    hundred = [float(n) for n in range(1, 101)]
    assert spread(hundred) == "n 100, ms p50 51 p99 99 max 100"


def test_periods_are_between_distinct_settle_times_in_order() -> None:
    t0 = datetime(2026, 12, 6, 12, tzinfo=UTC)
    # a round's letters share one settle time; the order they are read in does not matter
    stamps = [t0 + timedelta(milliseconds=ms) for ms in (250, 0, 0, 100, 250, 100, 0)]
    assert periods(stamps) == [100.0, 150.0]
    assert periods([t0, t0]) == []
    assert periods([]) == []


def test_exactly_once_counts_the_missing_and_the_doubled() -> None:
    copies = {"a": 1, "b": 2, "d": 0, "e": 3}
    assert exactly_once(["a", "b", "c", "d", "e"], copies) == (2, 2)
    assert exactly_once(["a"], copies) == (0, 0)
    assert exactly_once([], copies) == (0, 0)


def test_clock_keeps_each_step_and_the_rounds_bounds_without_the_heartbeat() -> None:
    clock = Clock()
    take, publish, heartbeat = STEPS[0][0], STEPS[4][0], STEPS[-1][0]
    clock.add(heartbeat, 0.0, 0.5)
    clock.add(take, 1.0, 1.5)
    clock.add(publish, 1.5, 2.0)
    clock.add(take, 2.0, 2.25)
    clock.add(heartbeat, 9.0, 9.5)
    assert (clock.first, clock.last) == (1.0, 2.25)
    assert clock.took[take] == [0.5, 0.25]
    table = clock.table(wall=10.0)
    assert table[0].split() == [
        "step", "calls", "total", "s", "share", "p50", "ms", "p99", "ms", "first", "10%", "last", "10%"
    ]  # fmt: skip
    rows = {line[:36].strip(): line[36:].split() for line in table[1:]}
    assert list(rows) == [take, publish, heartbeat]  # in a round's order; steps never taken left out
    # bench.flood.percentile: nearest rank; a tenth of 2 calls is the first one, and the last
    assert rows[take] == ["2", "0.75", "8%", "250.0", "500.0", "500.0", "250.0"]
    assert rows[heartbeat] == ["2", "1.00", "10%", "500.0", "500.0", "500.0", "500.0"]


def test_the_tenths_show_a_step_that_grows_as_the_replay_goes_on() -> None:
    clock = Clock()
    ask = STEPS[1][0]
    for n in range(100):  # 1 ms to 100 ms: the first ten calls 1-10 ms, the last ten 91-100
        clock.add(ask, float(n), n + (n + 1) / 1000)
    row = clock.table(wall=100.0)[1][36:].split()
    assert row[-2:] == ["5.0", "95.0"]  # nearest rank: the fifth of ten


async def test_steps_timed_wraps_each_step_while_inside_and_puts_it_back_and_skips_empty_calls() -> None:
    originals = [getattr(owner, name) for _, owner, name in STEPS]
    clock = Clock()
    with steps_timed(clock):
        wrapped = [getattr(owner, name) for _, owner, name in STEPS]
        assert all(w is not o for w, o in zip(wrapped, originals, strict=True))
        pace = Pace(1000.0)
        assert await pace.take(1, lambda: False) is True  # the real step runs under its wrapper
        await Operation.settled(cast(Operation, None), [], "not_replayed")  # no letters: returns at once
    assert [getattr(owner, name) for _, owner, name in STEPS] == originals
    assert list(clock.took) == ["the pace's wait"]
    assert len(clock.took["the pace's wait"]) == 1


def test_the_command_line_defaults_are_the_targets_case() -> None:
    args = parser().parse_args([])
    assert (args.letters, args.rate, args.live_rate, args.cancel_after) == (3000, 200.0, 10.0, 5.0)
    assert args.scenario == "all"
    help_text = parser().format_help()
    assert "worker dlq cancel" in help_text
    assert "--cancel-after" in help_text
