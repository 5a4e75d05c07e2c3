"""pytest fixtures that start the LTM worker and its services for a bot team's integration tests.

Enable it in the root `conftest.py` (or a test module) of the tests that use it:

    pytest_plugins = ["worker.testing.pytest_plugin"]

or on the command line: `pytest -p worker.testing.pytest_plugin`. Needs a Docker engine and the `testing`
extra, installed from the worker's checkout into the tests' environment
(`pip install -e '/path/to/checkout[testing]'`).

- `ltm_stack` (session): one `worker.testing.stack.LtmStack` for the test run: Postgres migrated, RabbitMQ
  with the contract's users and topology, Redis, and `LTM_STACK_WORKERS` (default 1) `worker run` processes.
  Under pytest-xdist each xdist worker process starts its own stack.
- `ltm_shard` (each test): a new shard id with its own RabbitMQ user `shard-<n>` and so its own queues, the
  Redis URL, the Postgres DSN and `await ltm_shard.seed()` for bot rows with a new guild; the user and its
  queues are deleted after the test.

A stack that cannot start fails every test that uses it with one message: each reason once, the containers'
and the workers' logs (it is not retried per test); `pytest -v` adds the errors underneath (the Docker
engine's own, with their tracebacks).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from worker.testing.stack import LtmShard, LtmStack

WORKERS_ENV = "LTM_STACK_WORKERS"


def _workers() -> int:
    raw = os.environ.get(WORKERS_ENV, "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else 1


def _start(verbose: bool) -> LtmStack:
    """The stack, or the test failed with its error's report (outside the `except`: one block, no chain)."""
    from worker.testing.stack import LtmStack, StackError

    try:
        return LtmStack.start(workers=_workers())
    except StackError as error:
        failure = error
    pytest.fail(failure.report(verbose=verbose), pytrace=False)


@pytest.fixture(scope="session")
def ltm_stack(request: pytest.FixtureRequest) -> Iterator[LtmStack]:
    """The worker and its three services, started once for the session and stopped at its end."""
    stack = _start(request.config.get_verbosity() > 0)
    try:
        yield stack
    finally:
        stack.close()


@pytest.fixture
def ltm_shard(ltm_stack: LtmStack) -> Iterator[LtmShard]:
    """A shard of its own for this test (user `shard-<n>`, its queues), on the session's stack."""
    shard = ltm_stack.shard()
    try:
        yield shard
    finally:
        ltm_stack.release(shard)
