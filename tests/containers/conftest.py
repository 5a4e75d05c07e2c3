"""Tests that need a Docker engine: the image, the compose stack, the suite's services from testcontainers.

Where no engine answers these tests are skipped with the reason, unless `LTM_REQUIRE_DOCKER=1` (CI sets it
when it has started an engine), which turns the skip into a failure: a run that should have exercised the
container paths never passes without them.
"""

from __future__ import annotations

import os

import pytest

from tests.services import docker_engine_reachable

REQUIRE_DOCKER_ENV_VAR = "LTM_REQUIRE_DOCKER"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/containers carries the `containers` marker (`-m containers` selects them)."""
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.containers)


@pytest.fixture(scope="session")
def docker_engine() -> None:
    """Skip (or, with LTM_REQUIRE_DOCKER=1, fail) when no Docker engine answers."""
    if docker_engine_reachable():
        return
    reason = "no Docker engine answers (DOCKER_HOST or /var/run/docker.sock)"
    if os.environ.get(REQUIRE_DOCKER_ENV_VAR, "").strip() in {"1", "true", "yes"}:
        pytest.fail(f"{reason}, and {REQUIRE_DOCKER_ENV_VAR} says this run needs one", pytrace=False)
    pytest.skip(f"{reason}; set {REQUIRE_DOCKER_ENV_VAR}=1 to make that a failure")
