"""One `worker run` process: worker/testing/process.py's ``ModuleProcess`` running `python -m worker run`,
with its own probe port and log file, ready when `/readyz` says so, stopped with SIGTERM (then SIGKILL).

The shipped stack (worker/testing/stack.py) spawns these; the repository's tests run the same class with JSON
logs (tests/support/harness.py). `free_port` is the one free-port helper of the repository.
"""

from __future__ import annotations

import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from worker.testing.process import ModuleProcess

__all__ = ["LOG_TAIL", "STOP_SECONDS", "WorkerProcess", "free_port", "tail"]

STOP_SECONDS = 15.0
LOG_TAIL = 40


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now (for a worker's probe port, a server of a test's own)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(text: str, lines: int = LOG_TAIL) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


class WorkerProcess(ModuleProcess):
    """`python -m worker <args>` (`run` unless told) of the installed package, its output in a log file."""

    def __init__(
        self,
        env: Mapping[str, str],
        log_path: Path,
        name: str = "worker",
        *,
        args: Sequence[str] = ("run",),
        cwd: Path | None = None,
        index: int = 0,
    ) -> None:
        super().__init__("worker", args, env, log_path, name, cwd=cwd)
        self.index = index
        port = self.env.get("LTM_HTTP_PORT", "").strip()
        #: the probe port, when the environment gives one (a test may give it a value that is no port)
        self.http_port = int(port) if port.isdecimal() else None

    @classmethod
    def spawn(cls, index: int, env: Mapping[str, str], log_dir: Path) -> WorkerProcess:
        """Start worker `index`: its own probe port on 127.0.0.1, its log `log_dir/worker-<index>.log`."""
        port = free_port()
        env = {**env, "LTM_HTTP_PORT": str(port), "LTM_HTTP_HOST": "127.0.0.1"}
        return cls(env, log_dir / f"worker-{index}.log", f"worker {index}", index=index).start()

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The child's `Popen` (started by `spawn`)."""
        assert self.proc is not None, f"{self.name} was not started"
        return self.proc

    @property
    def exit_code(self) -> int | None:
        """The exit code once the process has ended, else None."""
        return None if self.proc is None else self.proc.poll()

    def ready(self) -> bool:
        """Whether `/readyz` answers 200 (consuming, Postgres and Redis answering)."""
        if self.http_port is None:
            return False
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

    def stop(self, grace: float = STOP_SECONDS) -> int | None:
        """SIGTERM (the worker stops taking events and finishes the ones it holds), then SIGKILL after
        `grace` seconds; the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode
