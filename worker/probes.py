"""Is each dependency usable? Asked at start-up (wait until it is) and by ``/readyz``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import asyncpg

from worker.cache import InvalidationPublisher
from worker.faults import certificate_failure, describe
from worker.metrics import Metrics
from worker.store.migrate import pending_migrations


async def probe(check: Awaitable[Any], timeout: float = 3.0) -> str | None:
    """None when ``check`` completes in time, else a one-line reason."""
    try:
        await asyncio.wait_for(check, timeout=timeout)
    except Exception as exc:
        return describe(exc)
    return None


class InvalidSetting(Exception):
    """A setting that can never work (a malformed connection string): nothing to wait for."""


async def migrations_problem(dsn: str) -> str | None:
    """Why the worker cannot use Postgres yet (unreachable, or migrations pending), or None.

    Raises :class:`InvalidSetting` for a connection string that cannot be used at all. A certificate the
    server presents and the DSN's CA does not accept is a problem to wait on, as for RabbitMQ and Redis:
    a server whose certificate is replaced (or a CA file remounted) heals without a restart."""
    try:
        pending = await pending_migrations(dsn)
    except Exception as exc:
        # asyncpg's ClientConfigurationError is a ValueError, and so is ssl's SSLCertVerificationError
        if isinstance(exc, ValueError) and certificate_failure(exc) is None:
            raise InvalidSetting(f"invalid Postgres connection string: {' '.join(str(exc).split())}") from exc
        return describe(exc)
    if pending:
        return f"schema not migrated (run `worker migrate`): {', '.join(pending)}"
    return None


async def ping_postgres(pool: asyncpg.Pool) -> None:
    async with pool.acquire(timeout=2) as conn:
        await conn.fetchval("SELECT 1")


class Readiness:
    """``/readyz``: consuming, and Postgres and Redis answer. The pool is there once start-up got it."""

    def __init__(self, cache: InvalidationPublisher, metrics: Metrics) -> None:
        self.cache = cache
        self.metrics = metrics
        self.pool: asyncpg.Pool | None = None
        self.consuming = False

    def set_consuming(self, consuming: bool) -> None:
        self.consuming = consuming
        self.metrics.dependency_up.labels("rabbitmq").set(1 if consuming else 0)

    async def check(self) -> dict[str, str | None]:
        """None per dependency that works, else what is wrong with it (and ``ltm_dependency_up`` set)."""
        checks: dict[str, str | None] = {
            "rabbitmq": None if self.consuming else "not consuming (connecting or reconnecting)",
            "postgres": await probe(ping_postgres(self.pool)) if self.pool else "not connected yet",
            "redis": await probe(self.cache.ping()),
        }
        for name, problem in checks.items():
            self.metrics.dependency_up.labels(name).set(0 if problem else 1)
        return checks
