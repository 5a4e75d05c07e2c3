"""A Python test stack that cannot start says why once: its reasons each once, no chained errors under the
message, the errors underneath only with `pytest -v`. Reached without an engine: a Docker host that is not
there fails the three services' starts at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from worker.testing.engine import ContainerError
from worker.testing.stack import UNDERNEATH, StackError, reasons

SHARD_TESTS = """
pytest_plugins = ["worker.testing.pytest_plugin"]


def test_one(ltm_shard):
    pass


def test_two(ltm_shard):
    pass
"""


def run_without_an_engine(tmp_path: Path, *options: str) -> str:
    """pytest on two tests of the plugin, with DOCKER_HOST a socket that does not exist (and no properties
    file of testcontainers naming another): its whole output."""
    (tmp_path / "test_shard.py").write_text(SHARD_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TC_", "TESTCONTAINERS_", "DOCKER_"))}
    env |= {"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock", "HOME": str(tmp_path)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-rN",
            *options,
            "test_shard.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_a_stack_that_cannot_start_fails_each_test_with_its_reason_once(tmp_path: Path) -> None:
    output = run_without_an_engine(tmp_path)
    assert output.count("the LTM test stack did not start") == 2, output  # once for each test
    assert output.count("did not answer: DockerException") == 2, output  # three services, one sentence
    assert UNDERNEATH in output
    for chained in ("During handling of the above exception", "direct cause of the following exception"):
        assert chained not in output, output
    assert "Traceback" not in output, output
    assert "2 errors" in output


def test_with_v_the_errors_underneath_follow_with_their_tracebacks(tmp_path: Path) -> None:
    output = run_without_an_engine(tmp_path, "-v")
    assert output.count("the LTM test stack did not start") == 2, output
    assert output.count("--- the errors underneath ---") == 2, output
    assert "Traceback (most recent call last)" in output
    assert "docker.errors.DockerException" in output


def test_the_report_names_each_reason_once_and_keeps_the_causes() -> None:
    try:
        raise ContainerError("Redis: the Docker engine could not start image does-not-exist:1")
    except ContainerError as error:
        missing = error
    same = ContainerError(str(missing))
    other = ContainerError("Postgres: not ready within 120 s")
    text = reasons([missing, same, other])
    assert text == f"{missing}\n\n{other}"
    failure = StackError(f"the LTM test stack did not start:\n{text}\n{UNDERNEATH}", [missing, other])
    assert failure.report(verbose=False) == str(failure)
    verbose = failure.report(verbose=True)
    assert verbose.startswith(f"{failure}\n\n--- the errors underneath ---\nTraceback")
    assert "worker.testing.engine.ContainerError: Postgres: not ready within 120 s" in verbose
    assert StackError("no causes").report(verbose=True) == "no causes"
