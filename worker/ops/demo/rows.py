"""``worker demo seed`` and the Postgres half of ``clean``: the example's bot rows, added where missing and
deleted with the demo's memories and ledger rows."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg

from worker.ops.demo.example import (
    AUTHOR,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    GUILD,
    PERSONA_ID,
    PERSONA_NICKNAME,
    SPARROW,
    TOOL_CALL_PREFIX,
    cannot_reach,
    fail,
    say,
)
from worker.redact import describe, redact_setting
from worker.store.pool import connect_once
from worker.store.shard_queues import registered_shards
from worker.testing.seed import BotRows


async def seed(dsn: str, *, out: Callable[[str], None] = say) -> int:
    """Add the example's rows where missing; say what was added and what was there."""
    conn = await _connect(dsn)
    if conn is None:
        return EXIT_UNREACHABLE
    try:
        if not await _has_bot_tables(conn):
            fail(f"{redact_setting(dsn)} has no bot tables: run `worker migrate` first")
            return EXIT_FAILED
        rows = BotRows(conn)
        async with conn.transaction():
            server_id, added = await _row(
                conn, "SELECT server_id FROM servers WHERE server_disc_id = $1", rows.server, GUILD
            )
            out(f"servers: guild {GUILD} (server_id {server_id}) {'added' if added else 'was there'}")
            owner = await conn.fetchval("SELECT server_id FROM personas WHERE persona_id = $1", PERSONA_ID)
            if owner is not None and owner != server_id:
                fail(
                    f"personas row {PERSONA_ID} belongs to server_id {owner}, not to guild {GUILD}: "
                    'this is not a scratch database (seed a database of its own, README "Try it locally")'
                )
                return EXIT_FAILED
            if owner is None:
                await rows.persona(server_id, PERSONA_NICKNAME, persona_id=PERSONA_ID)
            out(
                f"personas: persona {PERSONA_ID} ({PERSONA_NICKNAME}) on that server "
                f"{'was there' if owner is not None else 'added'}"
            )
            for disc_id, who in ((AUTHOR, "the author"), (SPARROW, "Sparrow, a member")):
                user_id, added = await _row(
                    conn, "SELECT user_id FROM users WHERE user_disc_id = $1", rows.user, disc_id
                )
                out(f"users: {disc_id}, {who} (user_id {user_id}) {'added' if added else 'was there'}")
    except asyncpg.PostgresError as exc:
        fail(f"the database refused the seed: {describe(exc)}")
        return EXIT_FAILED
    finally:
        await conn.close()
    return EXIT_OK


async def _connect(dsn: str) -> asyncpg.Connection | None:
    """A connection to the database, or None (said on stderr) when Postgres cannot be reached."""
    try:
        return await connect_once(dsn, timeout=10)
    except (OSError, TimeoutError, ValueError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        cannot_reach("Postgres", dsn, exc)
        return None


async def _has_bot_tables(conn: asyncpg.Connection) -> bool:
    return await conn.fetchval("SELECT to_regclass('public.personas')") is not None


async def _row(
    conn: asyncpg.Connection, select: str, insert: Callable[[str], Awaitable[int]], key: str
) -> tuple[int, bool]:
    """The id of the row ``select`` finds, else of the row ``insert`` adds; and whether it was added."""
    found = await conn.fetchval(select, key)
    if found is not None:
        return int(found), False
    return await insert(key), True


async def recorded_shards(dsn: str) -> list[int]:
    """The shards with a queue of their own recorded in ``ltm_shard_queues`` (none when it cannot be read)."""
    try:
        conn = await connect_once(dsn, timeout=10)
    except Exception:
        return []
    try:
        if await conn.fetchval("SELECT to_regclass('public.ltm_shard_queues')") is None:
            return []
        return list(await registered_shards(conn))
    except asyncpg.PostgresError:
        return []
    finally:
        await conn.close()


async def clean_rows(dsn: str, out: Callable[[str], None]) -> int:
    conn = await _connect(dsn)
    if conn is None:
        return EXIT_UNREACHABLE
    try:
        if not await _has_bot_tables(conn):
            out("database: no bot tables, nothing to delete")
            return EXIT_OK
        async with conn.transaction():
            ledger = 0
            if await conn.fetchval("SELECT to_regclass('public.ltm_processed_events')") is not None:
                # the demo's, whichever shard sent them (--shard)
                ledger = _count(
                    await conn.execute(
                        "DELETE FROM ltm_processed_events WHERE starts_with(tool_call_id, $1)",
                        TOOL_CALL_PREFIX,
                    )
                )
            # personal memories go with their users, server memories and the persona with the server
            users = _count(
                await conn.execute("DELETE FROM users WHERE user_disc_id = ANY($1)", [AUTHOR, SPARROW])
            )
            servers = _count(await conn.execute("DELETE FROM servers WHERE server_disc_id = $1", GUILD))
        out(
            f"database: deleted {ledger} ledger rows, {users} users rows, {servers} servers row "
            "(with its persona and memories)"
        )
    except asyncpg.PostgresError as exc:
        fail(f"the database refused the clean-up: {describe(exc)}")
        return EXIT_FAILED
    finally:
        await conn.close()
    return EXIT_OK


def _count(status: str) -> int:
    """The row count of a ``DELETE n`` command status."""
    return int(status.rsplit(" ", 1)[-1])
