"""The load generator lives beside the worker: what ships, and what ``worker bench`` does without it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from setuptools import find_packages

REPO = Path(__file__).resolve().parents[2]


def worker(*args: str, cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def installed(tmp_path: Path) -> Path:
    """What the wheel holds, ``contracts`` and ``worker``, copied away from the checkout."""
    site = tmp_path / "site"
    for package in ("contracts", "worker"):
        shutil.copytree(REPO / package, site / package, ignore=shutil.ignore_patterns("__pycache__"))
    return site


def test_the_wheel_holds_the_service_only() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]

    packages = find_packages(where=str(REPO), include=include)

    assert packages, "the wheel holds packages"
    assert {p.split(".")[0] for p in packages} == {"contracts", "worker"}, "not bench/ nor sim/"


def test_the_image_copies_the_service_only() -> None:
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text(encoding="utf-8")
    copies = [
        line.split()[1]
        for line in dockerfile.splitlines()
        if line.startswith("COPY ") and "--from" not in line
    ]

    assert "worker" in copies
    assert "bench" not in copies
    assert "sim" not in copies


def test_worker_bench_from_the_checkout_is_the_load_generator() -> None:
    done = worker("bench", "--help", cwd=REPO)

    assert done.returncode == 0, done.stderr
    assert "--events" in done.stdout
    assert "--skip-ceilings" in done.stdout


def test_worker_bench_without_the_checkout_says_where_the_load_generator_is(
    installed: Path, tmp_path: Path
) -> None:
    listed = worker("--help", cwd=tmp_path, pythonpath=installed)
    helped = worker("bench", "--help", cwd=tmp_path, pythonpath=installed)
    ran = worker("bench", "--events", "10", cwd=tmp_path, pythonpath=installed)

    assert listed.returncode == 0, listed.stderr
    assert "python -m bench" in listed.stdout
    assert helped.returncode == 0, helped.stderr
    assert "ships with the source checkout" in helped.stdout
    assert ran.returncode == 2
    assert "run `python -m bench ...`" in ran.stderr
    assert "Traceback" not in ran.stderr
