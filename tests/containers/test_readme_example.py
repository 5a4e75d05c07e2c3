"""docs/testing-your-shard.md, Python: the example and its `pytest.ini` run as written, as a bot team would
run them (their own directory, no conftest or settings of this repository, the plugin and the shard kit from
the installed package), and pytest reports no warning."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.support.commands import run_timed

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 600


def readme_python_example(readme: str, language: str = "python") -> str:
    """The first ```python (or other `language`) block under `## Python` of docs/testing-your-shard.md."""
    python = readme.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(rf"```{language}\n(.*?)```", python, re.DOTALL)
    assert match, f"no ```{language} block under ## Python"
    return match.group(1)


def test_the_python_example_of_the_readme_runs_as_written(
    docker_engine: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = (REPO / "docs" / "testing-your-shard.md").read_text()
    example = readme_python_example(readme)
    assert 'pytest_plugins = ["worker.testing.pytest_plugin"]' in example
    (tmp_path / "test_memory.py").write_text(example)
    (tmp_path / "pytest.ini").write_text(readme_python_example(readme, "ini"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LTM_TEST_", "PYTEST_"))}
    done, took = run_timed(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_memory.py"],
        cwd=tmp_path,
        env=env,
        timeout=TIMEOUT,
    )
    output = done.stdout + done.stderr
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "(no output)"
    with capsys.disabled():
        print(f"\nthe README's Python example: {summary} ({took:.1f} s, the stack's start included)")
    assert done.returncode == 0, "\n".join(output.splitlines()[-80:])
    assert re.search(r"\b1 passed\b", summary), summary
    # newcomer review 4, F16: no pytest-asyncio deprecation warning (nor any other) with the README's ini
    assert "warning" not in summary, "\n".join(output.splitlines()[-80:])
