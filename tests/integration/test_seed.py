"""One bot-row seeder (worker/testing/seed.py ``BotRows``) writes the bot's rows for the tests, the try-out
stack, ``worker demo seed`` and the bench: each user of it leaves the rows the bot would have, read back
from Postgres."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import asyncpg
import pytest

from bench import flood, latency, noisy
from worker.ops.demo.example import AUTHOR, GUILD, PERSONA_ID, PERSONA_NICKNAME, SPARROW
from worker.ops.demo.rows import seed as demo_seed
from worker.testing.seed import BotRows, seed_try_out


@pytest.fixture
async def conn(migrated_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(migrated_dsn)
    yield connection
    await connection.close()


async def personas_of(conn: asyncpg.Connection, guild: str) -> list[tuple[int, str]]:
    rows = await conn.fetch(
        "SELECT p.persona_id, p.persona_nickname FROM personas p JOIN servers s USING (server_id)"
        " WHERE s.server_disc_id = $1",
        guild,
    )
    return [(row["persona_id"], row["persona_nickname"]) for row in rows]


async def users(conn: asyncpg.Connection) -> set[str]:
    return {row["user_disc_id"] for row in await conn.fetch("SELECT user_disc_id FROM users")}


async def test_two_worlds_without_ids_are_two_guilds_apart(conn: asyncpg.Connection) -> None:
    rows = BotRows(conn)
    first, second = await rows.world(), await rows.world(persona_nickname="Mori")
    assert first.guild_disc_id != second.guild_disc_id
    assert first.trigger_disc_id != second.trigger_disc_id
    assert await personas_of(conn, second.guild_disc_id) == [(second.persona_id, "Mori")]
    assert await users(conn) == {first.trigger_disc_id, second.trigger_disc_id}
    lineages = await conn.fetch("SELECT persona_lineage_id FROM personas ORDER BY persona_id")
    assert [row["persona_lineage_id"] for row in lineages] == [first.lineage_id, second.lineage_id]


async def test_a_seeder_given_ids_uses_them_and_a_persona_may_name_its_id(conn: asyncpg.Connection) -> None:
    rows = BotRows(conn, guild="1150000000000000001", trigger="1150000000000000200")
    world = await rows.world(self_teaching=False)
    assert (world.guild_disc_id, world.trigger_disc_id) == ("1150000000000000001", "1150000000000000200")
    flags = await conn.fetchrow(
        "SELECT self_teaching_enabled, personal_memories_enabled FROM server_member_permissions_configs"
        " WHERE server_id = $1",
        world.server_id,
    )
    assert tuple(flags) == (False, True)
    persona_id, lineage = await rows.persona(
        world.server_id, "Alt", is_alter=True, persona_id=4242, prefixes={"a": "b"}
    )
    assert persona_id == 4242
    assert lineage != world.lineage_id
    naming = await conn.fetchval("SELECT prefixes FROM persona_naming_configs WHERE persona_id = 4242")
    assert json.loads(naming) == {"a": "b"}


async def test_a_try_out_is_the_rows_it_names(migrated_dsn: str, conn: asyncpg.Connection) -> None:
    try_out = await seed_try_out(migrated_dsn, persona_nickname="Kit")
    assert await personas_of(conn, try_out.guild_disc_id) == [(try_out.persona_id, "Kit")]
    assert await conn.fetchval("SELECT user_id FROM users WHERE user_disc_id = $1", try_out.user_disc_id) == (
        try_out.user_id
    )
    assert try_out.event({"memory_content": "x"}, shard_id=1)["context"]["persona_id"] == try_out.persona_id


async def test_demo_seed_adds_the_example_rows_once(migrated_dsn: str, conn: asyncpg.Connection) -> None:
    said: list[str] = []
    assert await demo_seed(migrated_dsn, out=said.append) == 0
    assert await demo_seed(migrated_dsn, out=said.append) == 0
    assert await personas_of(conn, GUILD) == [(PERSONA_ID, PERSONA_NICKNAME)]
    assert await users(conn) == {AUTHOR, SPARROW}
    assert [line.endswith("added") for line in said] == [True] * 4 + [False] * 4
    assert all(line.endswith("was there") for line in said[4:])


async def test_the_benches_seed_their_guilds(migrated_dsn: str, conn: asyncpg.Connection) -> None:
    persona = await flood.seed(migrated_dsn)
    assert await personas_of(conn, flood.GUILD) == [(persona, "Tomori")]
    assert flood.TRIGGER in await users(conn)
    await conn.execute("TRUNCATE servers, users CASCADE")

    persona = await latency.seed(migrated_dsn)
    assert await personas_of(conn, latency.GUILD) == [(persona, "Tomori")]
    assert {latency.TRIGGER, latency.SPARROW} <= await users(conn)
    await conn.execute("TRUNCATE servers, users CASCADE")

    seeded = await noisy.seed(migrated_dsn, [noisy.GUILD_A, noisy.GUILD_B])
    for guild in (noisy.GUILD_A, noisy.GUILD_B):
        assert await personas_of(conn, guild) == [(seeded.personas[guild], "Tomori")]
    assert await users(conn) == {noisy.AUTHOR}
