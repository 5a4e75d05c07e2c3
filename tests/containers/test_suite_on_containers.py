"""The integration tier with every service from testcontainers (CI's main run uses the local services).

Runs `pytest tests/integration` in a subprocess whose environment names no service (no `LTM_TEST_*` URL, no
worker `LTM_*` URL, no libpq `PG*` variable), so each service comes from a container of
worker/testing/images.py (`LTM_*_IMAGE` overrides apply). Prints how long it took and pytest's summary line;
on failure, the subprocess's tail.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.containers.timed import run_timed

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 40 * 60
#: what would point the run at this machine's services instead of containers
LOCAL_POINTERS = (
    "LTM_TEST_",
    "LTM_POSTGRES_DSN",
    "LTM_RABBITMQ_URL",
    "LTM_REDIS_URL",
    "PGHOST",
    "PGPORT",
    "PGUSER",
    "PGPASSWORD",
    "PGDATABASE",
    "PGSERVICE",
    "PYTEST_",
)


def test_the_integration_tier_passes_with_every_service_from_containers(
    docker_engine: None, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(LOCAL_POINTERS)}
    env["LTM_REQUIRE_DOCKER"] = "1"
    done, took = run_timed(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests/integration"],
        cwd=REPO,
        env=env,
        timeout=TIMEOUT,
    )
    lines = (done.stdout + done.stderr).strip().splitlines()
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "(no output)"
    header = [line for line in lines[:30] if line.startswith("services: ")]
    with capsys.disabled():
        print(f"\nintegration tier on containers: {summary} in {took:.0f} s")
        for line in header:
            print(f"  {line}")
    assert done.returncode == 0, "\n".join(lines[-120:])
    assert len(header) == 3, lines[:30]
    assert all(": container, image " in line for line in header), header
    assert re.search(r"\d+ passed", summary), summary
