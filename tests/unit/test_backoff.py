"""The reconnect backoff: doubling to a low cap, each wait jittered, reset after a success."""

from __future__ import annotations

import random

import pytest

from worker.runtime.backoff import CAP_SECONDS, FIRST_SECONDS, Backoff


def test_the_step_doubles_to_the_cap_and_each_wait_lies_in_its_upper_half() -> None:
    backoff = Backoff(draw=lambda low, high: high)
    assert [backoff.next() for _ in range(6)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    backoff = Backoff(draw=lambda low, high: low)
    assert [backoff.next() for _ in range(6)] == [0.25, 0.5, 1.0, 1.5, 1.5, 1.5]


def test_a_fleet_that_lost_the_broker_together_does_not_retry_in_step() -> None:
    fleet = [Backoff(draw=random.Random(seed).uniform) for seed in range(20)]
    for _ in range(8):
        waits = [b.next() for b in fleet]
        assert all(0 < w <= CAP_SECONDS for w in waits)
        assert len({round(w, 3) for w in waits}) > 10  # spread, not one wave


def test_reset_starts_again_from_the_first_step() -> None:
    backoff = Backoff(draw=lambda low, high: high)
    for _ in range(5):
        backoff.next()
    backoff.reset()
    assert backoff.next() == FIRST_SECONDS


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="first"):
        Backoff(first=5, cap=1)
