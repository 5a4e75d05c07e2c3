"""One test's stack for the e2e tier: its service URLs and the worker processes started on them (the
fixture that makes it is ``stack`` in conftest.py; tests/e2e/cluster.py makes one on a private cluster)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.factories import BotRows
from tests.support.harness import REPO, WorkerProcess
from worker.config import env_of


@dataclass
class Stack:
    """Service URLs for one test and the worker processes started on them."""

    postgres_dsn: str
    rabbitmq_url: str
    redis_url: str
    log_dir: Path
    rows: BotRows
    workers: list[WorkerProcess] = field(default_factory=list)

    def env(self, **overrides: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LTM_", "MAX_"))}
        env.update(
            env_of(
                postgres_dsn=self.postgres_dsn,
                rabbitmq_url=self.rabbitmq_url,
                redis_url=self.redis_url,
                log_format="json",
                retry_base_delay_ms=200,
                retry_max_delay_ms=1000,
                shutdown_grace_seconds=10,
            )
        )
        env["PYTHONUNBUFFERED"] = "1"
        env.update(overrides)
        return env

    def worker(self, **env_overrides: str) -> WorkerProcess:
        """Start one more worker process (``worker run``) on this stack."""
        n = len(self.workers) + 1
        process = WorkerProcess(
            self.env(**env_overrides), self.log_dir / f"worker-{n}.log", name=f"worker-{n}"
        )
        self.workers.append(process.start())
        return process

    def cli(self, *args: str, timeout: float = 120, **env_overrides: str) -> subprocess.CompletedProcess[str]:
        """Run ``worker ARGS...`` on this stack to the end (blocking: call it via ``asyncio.to_thread``)."""
        return subprocess.run(
            [sys.executable, "-m", "worker", *args],
            cwd=REPO,
            env=self.env(**env_overrides),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    async def workers_ready(self) -> None:
        for process in self.workers:
            await process.wait_for_log("consuming")
