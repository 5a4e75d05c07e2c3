"""A child process for a test or a simulation: ``python -m <module> <args>`` with its output in a log file.

The one process runner of the repository: `worker run` in worker/testing/workers.py (the shipped stack),
the tests' worker processes (tests/support/harness.py) and the simulator's and the bench's children
(sim/process.py) are all this class. A child runs in a session of its own (a signal meant for the parent's
terminal does not reach it), its stdout and stderr appended to its log file; the e2e tests read its JSON log
lines. Standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

__all__ = ["TAIL_CHARS", "ModuleProcess", "ProcessFailed", "stop_all"]

#: how much of the log an error message quotes
TAIL_CHARS = 3000


class ProcessFailed(RuntimeError):
    """A child exited, or did not do what was awaited of it in time."""


class ModuleProcess:
    """``python -m module *args`` as a child process with its own log file (appended to)."""

    def __init__(
        self,
        module: str,
        args: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        name: str,
        *,
        cwd: Path | None = None,
    ) -> None:
        """``cwd``: where the child runs, and so which checkout ``python -m`` imports a module of the current
        directory from (None: this process's own)."""
        self.module = module
        self.cwd = cwd
        self.args = list(args)
        self.env = dict(env)
        self.log_path = log_path
        self.name = name
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> Self:
        """Start the child with ``extra`` arguments after the fixed ones."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, *self.args, *extra],
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was not started"
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self) -> str:
        """The end of the log, for an error message."""
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-TAIL_CHARS:]

    def check_alive(self) -> None:
        """Raise :class:`ProcessFailed`, quoting the log, when the child has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise ProcessFailed(
                f"{self.name} (pid {self.proc.pid}) exited with {self.proc.returncode}:\n{self.tail()}"
            )

    def lines(self) -> list[dict[str, Any]]:
        """The JSON log lines written so far (non-JSON lines are skipped)."""
        out: list[dict[str, Any]] = []
        if not self.log_path.exists():
            return out
        for raw in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                line = json.loads(raw)
                if isinstance(line, dict):
                    out.append(line)
        return out

    def count(self, event: str) -> int:
        """How many JSON log lines have this ``event``."""
        return sum(1 for line in self.lines() if line.get("event") == event)

    async def wait_for_log(self, event: str, *, at_least: int = 1, timeout: float = 30.0) -> None:
        """Wait until the log has ``at_least`` lines with this ``event``."""
        deadline = time.monotonic() + timeout
        while self.count(event) < at_least:
            if self.proc is not None and self.proc.poll() is not None:
                raise ProcessFailed(
                    f"{self.name} exited ({self.proc.returncode}) before logging {event!r}:\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                raise ProcessFailed(f"{self.name} did not log {event!r} within {timeout}s:\n{self.tail()}")
            await asyncio.sleep(0.05)

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None, f"{self.name} was not started"
        self.proc.send_signal(sig)

    def terminate(self) -> None:
        """SIGTERM, if the child still runs."""
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                self.signal(signal.SIGTERM)

    async def wait_exit(self, timeout: float = 60.0) -> int:
        """The exit code, once the child exited; :class:`ProcessFailed` after ``timeout`` seconds."""
        assert self.proc is not None, f"{self.name} was not started"
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise ProcessFailed(f"{self.name} still running after {timeout}s")
            await asyncio.sleep(0.05)
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the child's process group, if it still runs, and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


async def stop_all(processes: Sequence[ModuleProcess], grace: float) -> None:
    """SIGTERM every process; SIGKILL the ones still there ``grace`` seconds later."""
    for process in processes:
        process.terminate()
    deadline = time.monotonic() + grace
    for process in processes:
        if process.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(process.proc.wait, max(0.0, deadline - time.monotonic()))
    for process in processes:
        process.kill()
