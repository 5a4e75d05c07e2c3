"""Run a command to completion and time it: the container tests that run a whole program (a build, a
pytest run) and print how long it took."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


def run_timed(
    command: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout: float
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``command`` (no stdin, output captured as text, any exit code) and the seconds it took."""
    began = time.monotonic()
    done = subprocess.run(
        list(command),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return done, time.monotonic() - began
