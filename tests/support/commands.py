"""Run a command to completion, with a timeout: blocking and timed (the container tests that run a whole
program, a build, and print how long it took), or from a coroutine (`rabbitmqctl` and the like)."""

from __future__ import annotations

import asyncio
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


async def run_command(*command: str, timeout: float) -> tuple[int, str]:
    """Run a command with no input; its exit code and output. A timeout kills it and raises TimeoutError."""
    process = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    return int(process.returncode or 0), output.decode(errors="replace").strip()
