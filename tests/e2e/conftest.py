"""An isolated stack per test: a migrated database, a vhost, Redis, and worker processes on them."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import pytest

from tests.e2e.harness import WorkerProcess
from tests.factories import BotRows
from worker.store.migrate import apply_migrations


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
            LTM_POSTGRES_DSN=self.postgres_dsn,
            LTM_RABBITMQ_URL=self.rabbitmq_url,
            LTM_REDIS_URL=self.redis_url,
            LTM_LOG_FORMAT="json",
            LTM_RETRY_BASE_DELAY_MS="200",
            LTM_RETRY_MAX_DELAY_MS="1000",
            LTM_SHUTDOWN_GRACE_SECONDS="10",
            PYTHONUNBUFFERED="1",
        )
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

    async def workers_ready(self) -> None:
        for process in self.workers:
            await process.wait_for_log("consuming")


@pytest.fixture
async def stack(postgres_dsn: str, rabbitmq_url: str, redis_url: str, tmp_path: Path) -> AsyncIterator[Stack]:
    await apply_migrations(postgres_dsn)
    conn = await asyncpg.connect(postgres_dsn)
    stack = Stack(postgres_dsn, rabbitmq_url, redis_url, tmp_path, BotRows(conn))
    try:
        yield stack
    finally:
        for process in stack.workers:
            process.kill()
        await conn.close()
