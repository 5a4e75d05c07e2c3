"""Fixtures for tests against a real, migrated Postgres database."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest
import structlog

from tests.factories import BotRows
from tests.support.inprocess import WAIT, Workers
from worker.config import Settings
from worker.store.pool import create_pool


@pytest.fixture
async def pool(migrated_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    """A worker pool on the migrated database, large enough for the concurrency tests."""
    pool = await create_pool(migrated_dsn, size=20)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
async def rows(migrated_dsn: str) -> AsyncIterator[BotRows]:
    """Seeds bot rows through its own autocommit connection."""
    conn = await asyncpg.connect(migrated_dsn)
    try:
        yield BotRows(conn)
    finally:
        await conn.close()


@pytest.fixture
def captured() -> Iterator[list[dict[str, Any]]]:
    """The structlog events logged while the test runs (the worker's loggers are structlog's)."""
    with structlog.testing.capture_logs() as log:
        yield log


@pytest.fixture
async def workers(
    migrated_dsn: str, rabbitmq_url: str, redis_url: str, captured: list[dict[str, Any]]
) -> AsyncIterator[Workers]:
    settings = Settings(
        postgres_dsn=migrated_dsn,
        rabbitmq_url=rabbitmq_url,
        redis_url=redis_url,
        http_port=0,
        retry_base_delay_ms=200,
        retry_max_delay_ms=1000,
        shutdown_grace_seconds=WAIT,
    )
    workers = Workers(settings, captured)
    try:
        yield workers
    finally:
        for worker, _ in workers.running:
            worker.stop()
        for _, task in workers.running:
            try:
                await asyncio.wait_for(task, WAIT)
            except BaseException:
                task.cancel()
