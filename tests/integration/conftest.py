"""Fixtures for tests against a real, migrated Postgres database."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from tests.factories import BotRows
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
