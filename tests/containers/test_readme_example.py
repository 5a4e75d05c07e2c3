"""README "Testing your shard", Python: the example runs as written, as a bot team would run it (its own
directory, no conftest or settings of this repository, the plugin from the installed package)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.containers.timed import run_timed

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 600


def readme_python_example(readme: str) -> str:
    """The first ```python block under `### Python` of `## Testing your shard`."""
    section = readme.split("\n## Testing your shard\n", 1)[1].split("\n## ", 1)[0]
    python = section.split("\n### Python\n", 1)[1].split("\n### ", 1)[0]
    match = re.search(r"```python\n(.*?)```", python, re.DOTALL)
    assert match, "no ```python block under ### Python"
    return match.group(1)


def test_the_python_example_of_the_readme_runs_as_written(
    docker_engine: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = readme_python_example((REPO / "README.md").read_text())
    assert 'pytest_plugins = ["worker.testing.pytest_plugin"]' in example
    (tmp_path / "test_memory.py").write_text(example)
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
