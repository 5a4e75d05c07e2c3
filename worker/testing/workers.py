"""One `worker run` process of the installed package, for the test stack (worker/testing/stack.py): started
with its own probe port and log file, ready when `/readyz` says so, stopped with SIGTERM (then SIGKILL).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LOG_TAIL", "STOP_SECONDS", "WorkerProcess", "free_port", "tail"]

STOP_SECONDS = 15.0
LOG_TAIL = 40


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(text: str, lines: int = LOG_TAIL) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


@dataclass
class WorkerProcess:
    """One `worker run` of the installed package, its log in a file and its probe port."""

    index: int
    process: subprocess.Popen[bytes]
    log_path: Path
    http_port: int

    @classmethod
    def spawn(cls, index: int, env: Mapping[str, str], log_dir: Path) -> WorkerProcess:
        port = free_port()
        log_path = log_dir / f"worker-{index}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "worker", "run"],
                env={**env, "LTM_HTTP_PORT": str(port), "LTM_HTTP_HOST": "127.0.0.1"},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return cls(index, process, log_path, port)

    def ready(self) -> bool:
        """Whether `/readyz` answers 200 (consuming, Postgres and Redis answering)."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.http_port}/readyz")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=2) as response:
                return int(response.status) == 200
        except (OSError, urllib.error.URLError):
            return False

    def log(self, lines: int = LOG_TAIL) -> str:
        try:
            return tail(self.log_path.read_text(errors="replace"), lines)
        except OSError as error:
            return f"(no log: {error})"

    def terminate(self) -> None:
        """SIGTERM: the worker stops taking events and finishes the ones it holds."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 15 s; the exit code."""
        if self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode
