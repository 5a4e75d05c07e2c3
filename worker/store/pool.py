"""The asyncpg pool: JSONB in and out as Python values (orjson), nothing else special."""

from __future__ import annotations

from typing import Any

import asyncpg
import orjson


def _encode_json(value: Any) -> str:
    return orjson.dumps(value).decode()


async def _init_connection(conn: asyncpg.Connection) -> None:
    for name in ("json", "jsonb"):
        await conn.set_type_codec(name, encoder=_encode_json, decoder=orjson.loads, schema="pg_catalog")


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset on release: nothing to undo. The worker leaves no session state behind (every statement
    runs in a transaction that is closed, advisory locks are transaction-scoped, no LISTEN, no SET), and
    asyncpg's default reset costs a round trip per event."""


def describe_failure(exc: BaseException) -> str:
    """One line naming what went wrong connecting to or talking to Postgres (never the DSN itself)."""
    text = " ".join(str(exc).split()) or "(no message)"
    # asyncpg's ClientConfigurationError is a ValueError, and so is what a port that is no number raises
    if isinstance(exc, ValueError):
        return f"invalid connection string: {text}"
    return f"{type(exc).__name__}: {text}"


async def create_pool(dsn: str, *, size: int = 10, connect_timeout: float = 10.0) -> asyncpg.Pool:
    """A pool of ``size`` connections whose JSON columns take and give Python values."""
    pool: asyncpg.Pool = await asyncpg.create_pool(
        dsn,
        min_size=1,
        max_size=size,
        init=_init_connection,
        reset=_keep_session,
        timeout=connect_timeout,
        command_timeout=60,
    )
    return pool
