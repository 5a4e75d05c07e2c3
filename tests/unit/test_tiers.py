"""The developer's plain `pytest` leaves out the tests marked slow, in one process and in pytest-xdist's
(pyproject's addopts run two; a worker process is handed the paths, so the decision is the controller's)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from tests.conftest import long_files_first

#: each runs a whole pytest session (about 25 s together): the file starts first under pytest-xdist
pytestmark = pytest.mark.long

REPO = Path(__file__).resolve().parents[2]
#: a test marked slow (tests/integration/test_dlq_oncall.py)
SLOW = "test_a_group_selects_what_it_counts"


def run_pytest(*args: str) -> subprocess.CompletedProcess[str]:
    # the services unreachable: a slow test that ran anyway would fail, not pass
    env = {
        **os.environ,
        "LTM_TEST_POSTGRES_DSN": "postgresql://nobody@127.0.0.1:1/none",
        "LTM_TEST_RABBITMQ_URL": "amqp://nobody:nothing@127.0.0.1:1/",
        "LTM_TEST_REDIS_URL": "redis://127.0.0.1:1/0",
        "LTM_TEST_MACHINE_GUARD": "off",
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", SLOW, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_plain_pytest_leaves_the_slow_tests_out(workers: str) -> None:
    done = run_pytest("-n", workers)
    # exit 5: nothing ran; the only test -k selects is slow, and left out
    assert done.returncode == 5, done.stdout[-2000:] + done.stderr[-2000:]


def test_naming_a_path_runs_the_slow_tests() -> None:
    done = run_pytest("-n", "0", "--collect-only", "tests/integration/test_dlq_oncall.py")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert SLOW in done.stdout


@dataclass
class Item:
    """What long_files_first reads of a pytest item."""

    nodeid: str
    marker: str = ""

    def get_closest_marker(self, name: str) -> str | None:
        return name if name == self.marker else None


def test_files_with_long_tests_go_first_then_the_larger_and_keep_their_tests_together() -> None:
    items = [
        Item("a.py::one"),
        Item("a.py::two"),
        Item("b.py::only"),
        Item("c.py::slow", "slow"),
        Item("c.py::other"),
        Item("d.py::p"),
        Item("d.py::q"),
        Item("d.py::r"),
        Item("e.py::nested_pytest", "long"),
        Item("e.py::quick"),
    ]
    long_files_first(cast(list[pytest.Item], items))
    assert [item.nodeid for item in items] == [
        # the file with a long test first
        "e.py::nested_pytest",
        "e.py::quick",
        # then by size, as pytest-xdist orders them itself (`slow` weighs nothing; equal sizes keep order)
        "d.py::p",
        "d.py::q",
        "d.py::r",
        "a.py::one",
        "a.py::two",
        "c.py::slow",
        "c.py::other",
        "b.py::only",
    ]
