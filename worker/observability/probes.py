"""Is each dependency usable? Asked at start-up (wait until it is) and by ``/readyz``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import asyncpg

from worker.faults import Problem, explain
from worker.invalidation.redis import InvalidationPublisher
from worker.observability.metrics import Metrics
from worker.redact import certificate_failure, describe
from worker.store.migrate import pending_migrations


async def probe(check: Awaitable[Any], timeout: float = 3.0, *, url: str | None = None) -> Problem | None:
    """None when ``check`` (of the dependency at ``url``) completes in time, else a one-line reason."""
    try:
        await asyncio.wait_for(check, timeout=timeout)
    except Exception as exc:
        return explain(exc, url)
    return None


class InvalidSetting(Exception):
    """A setting that can never work (a malformed connection string, a refused identity setting): nothing to
    wait for."""


async def migrations_problem(dsn: str) -> Problem | None:
    """Why the worker cannot use Postgres yet (unreachable, or migrations pending), or None.

    Raises :class:`InvalidSetting` for a connection string that cannot be used at all. A certificate the
    server presents and the DSN's CA does not accept is a problem to wait on, as for RabbitMQ and Redis:
    a server whose certificate is replaced (or a CA file remounted) heals without a restart."""
    try:
        pending = await pending_migrations(dsn)
    except Exception as exc:
        # asyncpg's ClientConfigurationError is a ValueError, and so is ssl's SSLCertVerificationError
        if isinstance(exc, ValueError) and certificate_failure(exc) is None:
            # the message alone (describe's, a password it quotes hidden), as `worker migrate` words it
            reason = describe(exc).partition(": ")[2]
            raise InvalidSetting(f"invalid Postgres connection string: {reason}") from exc
        return explain(exc, dsn)
    if pending:
        return Problem(f"schema not migrated (run `worker migrate`): {', '.join(pending)}")
    return None


async def ping_postgres(pool: asyncpg.Pool) -> None:
    async with pool.acquire(timeout=2) as conn:
        await conn.fetchval("SELECT 1")


class Readiness:
    """``/readyz``: consuming and not blocked by RabbitMQ, and Postgres and Redis answer. The pool is there
    once start-up got it."""

    def __init__(self, cache: InvalidationPublisher, metrics: Metrics) -> None:
        self.cache = cache
        self.metrics = metrics
        self.pool: asyncpg.Pool | None = None
        self.consuming = False
        #: why RabbitMQ blocks the connection (a memory or disk alarm), None when it does not
        self.blocked: str | None = None

    def set_consuming(self, consuming: bool) -> None:
        self.consuming = consuming
        self.metrics.dependency_up.labels("rabbitmq").set(1 if consuming else 0)

    def set_blocked(self, reason: str | None) -> None:
        """RabbitMQ blocks the connection (``reason``) or no longer does (None): ``ltm_rabbitmq_blocked``."""
        self.blocked = reason
        self.metrics.rabbitmq_blocked.set(0 if reason is None else 1)

    async def check(self) -> dict[str, str | None]:
        """None per dependency that works, else what is wrong with it (and ``ltm_dependency_up`` set)."""
        checks: dict[str, str | None] = {
            "rabbitmq": self._rabbitmq_problem(),
            "postgres": await probe(ping_postgres(self.pool)) if self.pool else "not connected yet",
            "redis": await probe(self.cache.ping()),
        }
        for name, problem in checks.items():
            # a blocked broker is up (ltm_rabbitmq_blocked says it blocks): not ready, but up
            up = self.consuming if name == "rabbitmq" else problem is None
            self.metrics.dependency_up.labels(name).set(1 if up else 0)
        return checks

    def _rabbitmq_problem(self) -> str | None:
        if not self.consuming:
            return "not consuming (connecting or reconnecting)"
        if self.blocked is not None:
            return f"blocked by the broker ({self.blocked}): results wait until the alarm clears"
        return None
