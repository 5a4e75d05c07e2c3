"""Service fixtures for integration and e2e tests; the machinery lives in tests/services.py.

Nothing here touches Docker or the network until a test requests one of these fixtures, except the check
that the machine's own services are left alone: one look at the local ones when a session that runs more
than unit tests starts and ends.
"""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tests.machine_guard import MachineGuard, MachineServicesDisturbed
from tests.services import Services, describe_sources


def _developers_run(config: pytest.Config) -> bool:
    """Whether this is a plain `pytest`: no path (pyproject's testpaths), no -m. Under pytest-xdist a worker
    process is given the paths, so it asks the controller's answer (`pytest_configure_node` below)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return bool(workerinput.get(DEVELOPERS_RUN, False))
    return config.args_source is pytest.Config.ArgsSource.TESTPATHS and not config.option.markexpr


DEVELOPERS_RUN = "ltm_developers_run"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist's controller, for each worker process: whether the run is a developer's plain `pytest`."""
    node.workerinput[DEVELOPERS_RUN] = _developers_run(node.config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A plain `pytest` (no path, no -m: the developer's run, pyproject's testpaths) leaves out the tests
    marked `slow`; naming a path (`pytest tests`, `pytest tests/integration`, what CI runs) or a marker
    expression (`-m slow`) runs them."""
    if _developers_run(config):
        slow = [item for item in items if item.get_closest_marker("slow")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if not item.get_closest_marker("slow")]
    long_files_first(items)


def long_files_first(items: list[pytest.Item]) -> None:
    """Orders the files for pytest-xdist, which hands out whole files in the order it is given (pyproject's
    addopts turn off its own order). Files with tests marked `long` come first (more of them first), then
    the others with more tests first, which is xdist's own order: that alone started the unit tier's file
    of nested pytest runs (three tests, 25 s) last, to run alone while the other process idled. A file's
    tests keep their order and stay together (the sort is stable). Ordering by the tests marked `slow` as
    well was tried and dropped: the integration tier took 280 s against 195 s in xdist's order (a CI run
    each), its floods then running side by side."""
    weight: dict[str, tuple[int, int]] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        long_tests, tests = weight.get(path, (0, 0))
        weight[path] = (long_tests + (item.get_closest_marker("long") is not None), tests + 1)
    items.sort(key=lambda item: tuple(-n for n in weight[item.nodeid.split("::", 1)[0]]))


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Where Postgres, RabbitMQ and Redis come from this run (nothing is started to say it)."""
    return [f"services: {line}" for line in describe_sources()]


@pytest.fixture(scope="session", autouse=True)
def machine_services_left_alone(request: pytest.FixtureRequest) -> Iterator[None]:
    """Warns when this machine's RabbitMQ, Redis or Postgres restarted during the run
    (tests/machine_guard.py): the suite stops only servers of its own. ``LTM_TEST_MACHINE_GUARD``:
    ``warn``, ``fail`` (the default under CI) or ``off``. Only for a session that runs more than unit
    tests, so those stay offline."""
    mode = os.environ.get("LTM_TEST_MACHINE_GUARD") or ("fail" if os.environ.get("CI") else "warn")
    if mode == "off" or all(item.nodeid.startswith("tests/unit/") for item in request.session.items):
        yield
        return
    loop = asyncio.new_event_loop()
    guard = MachineGuard(dict(os.environ))
    try:
        loop.run_until_complete(guard.start())
        yield
        problems = loop.run_until_complete(guard.finish())
    finally:
        loop.close()
    if problems:
        message = "this machine's services were disturbed during the test run: " + "; ".join(problems)
        if mode == "fail":
            pytest.fail(message + " (LTM_TEST_MACHINE_GUARD=warn only warns)", pytrace=False)
        warnings.warn(message, MachineServicesDisturbed, stacklevel=1)


@pytest.fixture(scope="session")
def test_services() -> Iterator[Services]:
    """Where Postgres, RabbitMQ and Redis come from this session (env URL, else container, else local).

    Each service is resolved the first time a test needs it; containers started for it stop at session end.
    """
    services = Services()
    try:
        yield services
    finally:
        services.close()


#: fixtures that migrate the test's database before it runs: a test that uses one of them gets its
#: `postgres_dsn` already migrated, a copy of the session's migrated template (milliseconds, not a migration
#: per test); their own `apply_migrations` then finds nothing to do
MIGRATED_BY = frozenset({"migrated_dsn", "pool", "rows", "stack", "private_broker_stack", "cluster_stack"})


@pytest.fixture
async def postgres_dsn(test_services: Services, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """DSN of a fresh database `ltm_test_<hex>`, dropped (WITH (FORCE)) after the test: empty, or, when the
    test also uses a fixture of `MIGRATED_BY`, a copy of the session's migrated template."""
    migrated = not MIGRATED_BY.isdisjoint(request.fixturenames)
    async with test_services.fresh_database(migrated=migrated) as dsn:
        yield dsn


@pytest.fixture
async def migrated_dsn(postgres_dsn: str) -> str:
    """The test's database (`postgres_dsn`) with every migration applied (copied from the template)."""
    return postgres_dsn


@pytest.fixture
async def rabbitmq_url(test_services: Services) -> AsyncIterator[str]:
    """AMQP URL of a fresh vhost `ltm-test-<hex>` (full permissions for the URL's user), deleted after."""
    async with test_services.fresh_vhost() as url:
        yield url


@pytest.fixture
async def redis_url(test_services: Services) -> str:
    """URL of a Redis server that has answered PING.

    Not isolated: keys and pub/sub channels are global to the server and other tests (or sessions) may share
    it, so a test must use unique keys and filter what it receives by event id. Nothing is flushed.
    """
    return await test_services.redis_url()
