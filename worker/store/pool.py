"""The asyncpg pool: JSONB in and out as Python values (orjson), and nothing a connection pooler breaks.

Through PgBouncer in transaction pooling mode (before 1.21, e.g. Debian bookworm's 1.18) a client's
statements may run on any server connection, so a named prepared statement made on one is missing on
the next: asyncpg's statement cache must be off (``statement_cache_size=0``, the default of
``LTM_POSTGRES_STATEMENT_CACHE_SIZE``). asyncpg then uses the unnamed statement and sends its
Parse/Describe with a Flush, not a Sync, so the Bind/Execute that follows still reaches the same server
connection. Nothing else the worker does needs a session: advisory locks are transaction-scoped, no
LISTEN, no SET, no temporary tables, and the pool's reset on release does nothing (see below). Off
costs a round trip and a parse per statement: two per batch of events (CAPACITY.md).
"""

from __future__ import annotations

from typing import Any

import asyncpg
import orjson

from worker.faults import explain
from worker.redact import certificate_failure, describe


def _encode_json(value: Any) -> str:
    return orjson.dumps(value).decode()


async def _init_connection(conn: asyncpg.Connection) -> None:
    for name in ("json", "jsonb"):
        await conn.set_type_codec(name, encoder=_encode_json, decoder=orjson.loads, schema="pg_catalog")


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset on release: nothing to undo. The worker leaves no session state behind (every statement
    runs in a transaction that is closed, advisory locks are transaction-scoped, no LISTEN, no SET), and
    asyncpg's default reset costs a round trip per event."""


def describe_failure(exc: BaseException, dsn: str | None = None) -> str:
    """One line naming what went wrong connecting to or talking to Postgres at ``dsn`` (never the DSN
    itself), saying what to do where a person must act (:func:`worker.faults.explain`)."""
    if certificate_failure(exc) is not None:  # a ValueError too, but the DSN may be right
        return describe(exc)
    # asyncpg's ClientConfigurationError is a ValueError, and so is what a port that is no number raises
    if isinstance(exc, ValueError):
        return f"invalid connection string: {describe(exc).partition(': ')[2]}"
    return explain(exc, dsn)


#: asyncpg's statement cache per connection unless configured: off, which works directly and through a
#: transaction-pooling PgBouncer alike (LTM_POSTGRES_STATEMENT_CACHE_SIZE)
DEFAULT_STATEMENT_CACHE_SIZE = 0


async def create_pool(
    dsn: str,
    *,
    size: int = 10,
    connect_timeout: float = 10.0,
    statement_cache_size: int = DEFAULT_STATEMENT_CACHE_SIZE,
) -> asyncpg.Pool:
    """A pool of ``size`` connections whose JSON columns take and give Python values."""
    pool: asyncpg.Pool = await asyncpg.create_pool(
        dsn,
        min_size=1,
        max_size=size,
        init=_init_connection,
        reset=_keep_session,
        timeout=connect_timeout,
        command_timeout=60,
        statement_cache_size=statement_cache_size,
    )
    return pool


async def connect_once(dsn: str, *, timeout: float = 60.0) -> asyncpg.Connection:
    """One connection for a few statements (migrations, checks): no statement cache, so it also works
    through a transaction-pooling PgBouncer."""
    conn: asyncpg.Connection = await asyncpg.connect(dsn, timeout=timeout, statement_cache_size=0)
    return conn
