"""Seed a fresh, migrated database with the bench's world: bot rows exactly as the bot would hold them.

Ids come from the world (explicit, then the sequences are moved past them), so two databases seeded
from the same world are identical and the same events mean the same thing in both. Memories are bulk
copied; their ids are the database's business. Ends with ``ANALYZE`` so the planner sees a database
that has been in use, not one with empty statistics.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import asyncpg
import orjson

from bench.world import World
from worker.store.migrate import apply_migrations


@dataclass(frozen=True, slots=True)
class Prefill:
    """Memories to write before the run, by scope: the world's background plus the limit scenarios."""

    server_memories: Mapping[tuple[int, int], int]
    personal_memories: Mapping[tuple[int, int], int]


async def seed_database(dsn: str, world: World, prefill: Prefill) -> dict[str, int]:
    """Migrate the (empty) database at ``dsn`` and write ``world``; the row counts written, by table."""
    await apply_migrations(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            counts = await _write(conn, world, prefill)
        await conn.execute("ANALYZE")
        return counts
    finally:
        await conn.close()


async def analyze(dsn: str) -> None:
    """``ANALYZE`` the database at ``dsn``: what autovacuum would do as the ledger fills.

    The seed's own ``ANALYZE`` sees an empty ``ltm_processed_events``, and plans cached while it was
    small (scans instead of its primary key) get slower with every event. Autovacuum re-analyzes it
    in production; the bench runs it itself after the warmup, because autovacuum may be off (it is
    on the CI machine) and would fire at a random moment of the measured window anyway.
    """
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


async def _copy(
    conn: asyncpg.Connection, table: str, columns: list[str], rows: list[tuple[object, ...]]
) -> int:
    if rows:
        await conn.copy_records_to_table(table, records=rows, columns=columns)
    return len(rows)


async def _write(conn: asyncpg.Connection, world: World, prefill: Prefill) -> dict[str, int]:
    users = [u for u in world.users if u.has_row]
    personas = [(s, p) for s in world.servers for p in s.personas]
    counts = {
        "servers": await _copy(
            conn,
            "servers",
            ["server_id", "server_disc_id", "is_dm_channel", "registration_locale"],
            [(s.server_id, s.disc_id, False, "en-US") for s in world.servers],
        ),
        "server_member_permissions_configs": await _copy(
            conn,
            "server_member_permissions_configs",
            ["server_id", "self_teaching_enabled", "personal_memories_enabled"],
            [
                (s.server_id, s.self_teaching, s.personal_enabled)
                for s in world.servers
                if not (s.self_teaching and s.personal_enabled) or s.server_id % 2 == 0
            ],
        ),
        "personas": await _copy(
            conn,
            "personas",
            ["persona_id", "server_id", "persona_nickname", "is_alter", "persona_lineage_id"],
            [(p.persona_id, s.server_id, p.nickname, p.is_alter, p.lineage_id) for s, p in personas],
        ),
        "persona_naming_configs": await _copy(
            conn,
            "persona_naming_configs",
            ["persona_id", "prefixes", "suffixes"],
            [
                (
                    p.persona_id,
                    orjson.dumps(dict(p.prefixes)).decode(),
                    orjson.dumps(dict(p.suffixes)).decode(),
                )
                for _, p in personas
                if p.prefixes or p.suffixes
            ],
        ),
        "users": await _copy(
            conn,
            "users",
            ["user_id", "user_disc_id", "privacy_level", "language_pref"],
            [(u.user_id, u.disc_id, u.privacy, "en-US") for u in users],
        ),
        "user_personalization_configs": await _copy(
            conn,
            "user_personalization_configs",
            ["user_id", "user_nickname", "prefix_override", "suffix_override", "addressing_style"],
            [
                (u.user_id, u.db_nickname, u.prefix_override, u.suffix_override, u.addressing_style)
                for u in users
                if u.personalization
            ],
        ),
        "user_persona_naming_preferences": await _copy(
            conn,
            "user_persona_naming_preferences",
            ["user_id", "persona_lineage_id", "nickname_override"],
            [
                (user_id, lineage, name)
                for (user_id, lineage), name in sorted(world.persona_nicknames.items())
            ],
        ),
        "personalization_blacklist": await _copy(
            conn,
            "personalization_blacklist",
            ["server_id", "user_disc_id"],
            [(s.server_id, disc) for s in world.servers for disc in s.blacklisted],
        ),
    }
    persona_of_lineage = {p.lineage_id: p.persona_id for _, p in personas}
    server_rows: list[tuple[object, ...]] = []
    for (server_id, lineage), n in sorted(_merged(world.server_memories, prefill.server_memories).items()):
        persona_id = persona_of_lineage.get(lineage)
        server_rows.extend(
            (server_id, persona_id, lineage, f"seeded server memory {i} of {server_id}/{lineage}")
            for i in range(n)
        )
    counts["server_memories"] = await _copy(
        conn, "server_memories", ["server_id", "persona_id", "persona_lineage_id", "content"], server_rows
    )
    personal_rows: list[tuple[object, ...]] = []
    for (user_id, lineage), n in sorted(_merged(world.personal_memories, prefill.personal_memories).items()):
        personal_rows.extend((user_id, lineage, f"seeded personal memory {i} of {user_id}") for i in range(n))
    counts["personal_memories"] = await _copy(
        conn, "personal_memories", ["user_id", "persona_lineage_id", "content"], personal_rows
    )
    for table, column in (("servers", "server_id"), ("users", "user_id"), ("personas", "persona_id")):
        await conn.execute(
            f"SELECT setval(pg_get_serial_sequence('{table}', '{column}'), "
            f"(SELECT COALESCE(max({column}), 0) + 1 FROM {table}), false)"
        )
    await conn.execute(
        "SELECT setval('persona_lineage_id_seq', (SELECT COALESCE(max(persona_lineage_id), 9999) + 1"
        " FROM personas), false)"
    )
    return counts


def _merged(*parts: Mapping[tuple[int, int], int]) -> dict[tuple[int, int], int]:
    merged: dict[tuple[int, int], int] = {}
    for part in parts:
        for key, n in part.items():
            merged[key] = merged.get(key, 0) + n
    return merged
