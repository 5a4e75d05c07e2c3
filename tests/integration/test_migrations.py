"""`worker migrate`: idempotent, safe concurrently, never touches an existing bot table."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest

from worker.store.migrate import MigrationError, apply_migrations, available_migrations, pending_migrations
from worker.testing.seed import BotRows

README = Path(__file__).resolve().parents[2] / "README.md"

pytestmark = pytest.mark.integration

BOT_TABLES = {
    "servers",
    "users",
    "user_personalization_configs",
    "user_persona_naming_preferences",
    "personas",
    "persona_naming_configs",
    "server_member_permissions_configs",
    "personalization_blacklist",
    "server_memories",
    "personal_memories",
}


async def tables(dsn: str) -> set[str]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {r["tablename"] for r in rows}
    finally:
        await conn.close()


async def test_migrate_creates_every_table_once(postgres_dsn: str) -> None:
    names = [f"{m.version:04d}_{m.name}" for m in available_migrations()]
    assert await pending_migrations(postgres_dsn) == names
    assert await apply_migrations(postgres_dsn) == names
    assert await apply_migrations(postgres_dsn) == []
    assert await pending_migrations(postgres_dsn) == []
    assert BOT_TABLES | {"ltm_processed_events", "ltm_schema_migrations"} <= await tables(postgres_dsn)


async def test_lineage_sequence_starts_at_10000(postgres_dsn: str) -> None:
    await apply_migrations(postgres_dsn)
    conn = await asyncpg.connect(postgres_dsn)
    try:
        rows = BotRows(conn)
        _, lineage = await rows.persona(await rows.server("1"), "T")
        assert lineage == 10000
    finally:
        await conn.close()


async def test_concurrent_migrations_take_turns(postgres_dsn: str) -> None:
    results = await asyncio.gather(*(apply_migrations(postgres_dsn) for _ in range(5)))
    applied = [names for names in results if names]
    assert len(applied) == 1
    assert applied[0] == [f"{m.version:04d}_{m.name}" for m in available_migrations()]


async def test_existing_bot_tables_are_left_alone(postgres_dsn: str) -> None:
    conn = await asyncpg.connect(postgres_dsn)
    try:
        # a bot database whose tables differ from ours: migrate must not add, change or drop anything there
        await conn.execute(
            "CREATE TABLE servers (server_id SERIAL PRIMARY KEY, server_disc_id TEXT, extra TEXT)"
        )
        await conn.execute("INSERT INTO servers (server_disc_id, extra) VALUES ('42', 'kept')")
        before = await conn.fetch(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'servers'"
            " ORDER BY column_name"
        )
        indexes_before = await conn.fetchval("SELECT count(*) FROM pg_indexes WHERE tablename = 'servers'")
        await apply_migrations(postgres_dsn)
        after = await conn.fetch(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'servers'"
            " ORDER BY column_name"
        )
        assert before == after
        assert (
            await conn.fetchval("SELECT count(*) FROM pg_indexes WHERE tablename = 'servers'")
            == indexes_before
        )
        assert await conn.fetchval("SELECT extra FROM servers") == "kept"
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'servers'::regclass AND NOT tgisinternal"
            )
            == 0
        )
    finally:
        await conn.close()


async def test_an_edited_migration_is_refused(postgres_dsn: str) -> None:
    await apply_migrations(postgres_dsn)
    conn = await asyncpg.connect(postgres_dsn)
    try:
        await conn.execute("UPDATE ltm_schema_migrations SET checksum = 'changed' WHERE version = 1")
    finally:
        await conn.close()
    with pytest.raises(MigrationError, match="was changed after it was applied"):
        await apply_migrations(postgres_dsn)


async def test_the_readmes_undo_line_drops_everything_migrate_made(postgres_dsn: str) -> None:
    """README "Undoing the defaults": its DROP statements, run after a full migrate, leave the schema empty
    (a later migration that adds an object must add it to that line)."""
    undo = "-d postgres -c 'DROP TABLE IF EXISTS"
    line = next(text for text in README.read_text().splitlines() if undo in text)
    sql = line.split(" -c '", 1)[1].rsplit("'", 1)[0]
    await apply_migrations(postgres_dsn)
    conn = await asyncpg.connect(postgres_dsn)
    try:
        await conn.execute(sql)
        left = await conn.fetch(
            "SELECT c.relname AS name, c.relkind::text AS kind FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'"
            " UNION ALL SELECT p.proname, 'function' FROM pg_proc p"
            " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'"
        )
    finally:
        await conn.close()
    assert [(row["name"], row["kind"]) for row in left] == []
