"""Numbered SQL migrations, applied once each, safe to run from many processes at once.

The files live in ``worker/store/migrations`` as ``NNNN_name.sql``. Every pending one runs in one
transaction, in order, and is recorded in ``ltm_schema_migrations`` with a checksum: either all of them
are applied or none. The transaction first takes a transaction-scoped advisory lock, so concurrent
``worker migrate`` runs take turns and the later ones find nothing left to do.

Transaction-scoped on purpose: it works through PgBouncer in transaction pooling mode, which hands each
transaction whatever server connection is free. A session lock would be taken on one server connection
and "released" on another, and stay held on the first until it closes, blocking every later migrate.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

import asyncpg

from worker.store.pool import connect_once

#: advisory lock key shared by every ``worker migrate`` (arbitrary, fixed: "LTM" + "MIGR")
MIGRATION_LOCK_KEY = 0x4C544D_4D494752

_CREATE_LEDGER = """
CREATE TABLE IF NOT EXISTS public.ltm_schema_migrations (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    checksum TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


class MigrationError(RuntimeError):
    """The database's migration history does not match the files shipped with this worker."""


def available_migrations() -> list[Migration]:
    """The migration files shipped in the package, in version order."""
    folder = resources.files("worker.store") / "migrations"
    found = []
    for entry in folder.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        number, _, rest = entry.name.partition("_")
        found.append(Migration(int(number), rest.removesuffix(".sql"), entry.read_text(encoding="utf-8")))
    return sorted(found, key=lambda m: m.version)


async def apply_migrations(dsn: str) -> list[str]:
    """Apply every migration the database has not seen, in one transaction; the names applied (may be
    empty). Raises :class:`MigrationError` (and applies nothing) when an applied migration was edited."""
    conn = await connect_once(dsn)
    try:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_KEY)
            return await _apply_pending(conn)
    finally:
        await conn.close()


async def _apply_pending(conn: asyncpg.Connection) -> list[str]:
    await conn.execute(_CREATE_LEDGER)
    rows = await conn.fetch("SELECT version, name, checksum FROM public.ltm_schema_migrations")
    applied = {row["version"]: row for row in rows}
    done: list[str] = []
    for migration in available_migrations():
        seen = applied.get(migration.version)
        if seen is not None:
            if seen["checksum"] != migration.checksum:
                raise MigrationError(
                    f"migration {migration.version:04d}_{migration.name} was changed after it was applied "
                    "(checksum differs); ship a new numbered migration instead of editing an applied one"
                )
            continue
        await conn.execute(migration.sql)
        await conn.execute(
            "INSERT INTO public.ltm_schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
            migration.version,
            migration.name,
            migration.checksum,
        )
        done.append(f"{migration.version:04d}_{migration.name}")
    return done


async def pending_migrations(dsn: str) -> list[str]:
    """Names of the migrations not yet applied (for ``worker check`` and start-up)."""
    conn = await connect_once(dsn)
    try:
        exists = await conn.fetchval("SELECT to_regclass('public.ltm_schema_migrations') IS NOT NULL")
        versions: set[int] = set()
        if exists:
            versions = {
                r["version"] for r in await conn.fetch("SELECT version FROM public.ltm_schema_migrations")
            }
        return [f"{m.version:04d}_{m.name}" for m in available_migrations() if m.version not in versions]
    finally:
        await conn.close()
