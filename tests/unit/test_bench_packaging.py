"""The load generator lives beside the worker, ``python -m bench`` from a checkout: the shipped package never
imports it."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from setuptools import find_packages

REPO = Path(__file__).resolve().parents[2]


def python(*args: str, cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [sys.executable, *args],
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


def test_python_m_bench_from_the_checkout_is_the_load_generator() -> None:
    done = python("-m", "bench", "--help", cwd=REPO)

    assert done.returncode == 0, done.stderr
    assert "--events" in done.stdout
    assert "--skip-ceilings" in done.stdout


def _imported(path: Path) -> set[str]:
    """The top-level names of the modules ``path`` imports (``import a.b``, ``from a import b``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_shipped_package_never_imports_the_bench_nor_the_simulators() -> None:
    importing = {
        str(path.relative_to(REPO)): sorted(_imported(path) & {"bench", "sim"})
        for path in sorted((REPO / "worker").rglob("*.py"))
    }

    assert {path: names for path, names in importing.items() if names} == {}


def test_the_worker_without_the_checkout_has_no_bench_command(installed: Path, tmp_path: Path) -> None:
    listed = python("-m", "worker", "--help", cwd=tmp_path, pythonpath=installed)
    asked = python("-m", "worker", "bench", "--events", "10", cwd=tmp_path, pythonpath=installed)

    assert listed.returncode == 0, listed.stderr
    assert "bench" not in listed.stdout
    assert asked.returncode == 2
    assert "invalid choice: 'bench'" in asked.stderr
    assert "Traceback" not in asked.stderr
