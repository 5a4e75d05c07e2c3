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

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import asyncpg
import orjson

from worker.faults import ClientKeyRefused, explain
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


#: libpq's own words for a key file it refuses (fe-secure-openssl.c)
_KEY_TOO_OPEN = (
    'private key file "{path}" has group or world access; file must have permissions u=rw (0600) or less if '
    "owned by the current user, or permissions u=rw,g=r (0640) or less if owned by root"
)


def client_key_problem(dsn: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Why libpq would refuse the client key the DSN (or ``PGSSLKEY``, or ``~/.postgresql/postgresql.key``)
    names, or None. asyncpg uses any key it can read; libpq refuses a key file that others may read, so the
    worker refuses it too, with libpq's rule and words (security review 4, N9): a regular file, mode 0600 or
    less, or 0640 or less when owned by root (a Kubernetes Secret mounted 0440 is). Looked at only as asyncpg
    would use it: TLS not disabled and a client certificate in play."""
    env = os.environ if environ is None else environ
    query = parse_qs(urlsplit(dsn).query)

    def given(name: str, variable: str) -> str | None:
        values = query.get(name)
        return values[-1] if values else env.get(variable)

    if (given("sslmode", "PGSSLMODE") or "prefer").strip().lower() == "disable":
        return None
    try:
        defaults = Path.home() / ".postgresql"
    except (RuntimeError, KeyError):  # no home directory: asyncpg looks for no default files either
        defaults = None
    cert = given("sslcert", "PGSSLCERT") or (str(defaults / "postgresql.crt") if defaults else None)
    if not cert or not os.path.exists(cert):
        return None
    key = given("sslkey", "PGSSLKEY") or (str(defaults / "postgresql.key") if defaults else None)
    try:
        found = os.stat(key) if key else None
    except OSError:  # no such key: asyncpg's own error names it (or the certificate holds the key)
        return None
    if found is None:
        return None
    if not stat.S_ISREG(found.st_mode):
        return f'private key file "{key}" is not a regular file'
    loose = found.st_mode & (0o037 if found.st_uid == 0 else 0o077)
    return _KEY_TOO_OPEN.format(path=key) if loose else None


def _refuse_loose_key(dsn: str) -> None:
    problem = client_key_problem(dsn)
    if problem is not None:
        raise ClientKeyRefused(problem)


async def create_pool(
    dsn: str,
    *,
    size: int = 10,
    connect_timeout: float = 10.0,
    statement_cache_size: int = DEFAULT_STATEMENT_CACHE_SIZE,
) -> asyncpg.Pool:
    """A pool of ``size`` connections whose JSON columns take and give Python values. Raises
    :class:`ClientKeyRefused` for a client key libpq would refuse."""
    _refuse_loose_key(dsn)
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
    through a transaction-pooling PgBouncer. Raises :class:`ClientKeyRefused` as :func:`create_pool` does."""
    _refuse_loose_key(dsn)
    conn: asyncpg.Connection = await asyncpg.connect(dsn, timeout=timeout, statement_cache_size=0)
    return conn
