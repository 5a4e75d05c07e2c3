"""Bot rows as the bot itself would have created them (CONTRACT.md section 3): :class:`BotRows` writes each
kind of row (a server, a persona, a user and their configs, memories), the one place that knows the bot
tables' columns for the worker's tests, ``worker demo seed`` and the bench; :func:`seed_try_out` makes a
guild for a try-out (a server, a persona, the triggering user and a second member "Sparrow"), and
:class:`TryOut` the tool-call events that name it.

Each try-out makes a new guild and users with random Discord ids, so tests sharing one database never meet.
The try-out is the TypeScript stack's (`seed()` of `@tomoribot/ltm-client/testing`): Sparrow is in the
event's context as a participant and a guild member, so a personal memory (`"memory_scope": "target_user",
"target_user": "Sparrow"`) is saved as it would be in the bot.
"""

from __future__ import annotations

import json
import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from contracts.shard.context import MemberInput, ParticipantInput, build_context

if TYPE_CHECKING:
    import asyncpg

__all__ = ["MEMBER_LABEL", "MEMBER_USERNAME", "BotRows", "TryOut", "World", "discord_id", "seed_try_out"]

#: the seeded second member: their username, and the global name and label a `target_user` names them by
MEMBER_USERNAME = "sparrow_ow"
MEMBER_LABEL = "Sparrow"


def discord_id() -> str:
    """A random 19-digit Discord id (snowflake-shaped)."""
    return str(10**18 + secrets.randbelow(9 * 10**18))


@dataclass(frozen=True)
class TryOut:
    """The seeded rows and the ids an event names."""

    server_id: int
    guild_disc_id: str
    persona_id: int
    persona_lineage_id: int
    user_id: int
    user_disc_id: str
    channel_disc_id: str
    bot_user_disc_id: str
    #: the second member, "Sparrow": `users.user_id` and Discord id
    member_user_id: int
    member_disc_id: str

    def event(
        self,
        arguments: Any,
        *,
        shard_id: int,
        tool_name: str = "create_long_term_memory",
        event_id: str | None = None,
    ) -> dict[str, Any]:
        """A tool-call event body (version 1) from this guild's user to this persona, answered to `shard_id`.

        `arguments` is what the model wrote, e.g. `{"memory_content": "{user} likes dogs",
        "memory_scope": "server_wide"}`.
        """
        return {
            "schema_version": 1,
            "event_id": event_id or str(uuid.uuid4()),
            "tool_call_id": f"call_{secrets.token_hex(6)}",
            "tool_name": tool_name,
            "issued_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            "shard_id": shard_id,
            "arguments": arguments,
            "context": self.context(),
        }

    def context(self, **overrides: Any) -> dict[str, Any]:
        """The event's ``context`` in this guild (``contracts.shard.build_context``): its user triggers, to
        this persona, with Sparrow as participant and member; what
        ``contracts.shard.LtmClient.create_memory(context=...)`` takes. ``overrides`` are ``build_context``'s
        parameters (``participants=[]``, ``thread_id=...``)."""
        sparrow = self.member_disc_id
        inputs: dict[str, Any] = {
            "guild_id": self.guild_disc_id,
            "channel_id": self.channel_disc_id,
            "user_id": self.user_disc_id,
            "bot_user_id": self.bot_user_disc_id,
            "persona_id": self.persona_id,
            "participants": [ParticipantInput(sparrow, MEMBER_LABEL, (MEMBER_LABEL, MEMBER_USERNAME))],
            "members": [MemberInput(sparrow, MEMBER_USERNAME, MEMBER_LABEL)],
        }
        return build_context(**{**inputs, **overrides})


@dataclass(frozen=True)
class World:
    """A seeded guild: its server, one persona of it and the user who triggers the events."""

    server_id: int
    persona_id: int
    lineage_id: int
    trigger_user_id: int
    guild_disc_id: str
    trigger_disc_id: str


class BotRows:
    """Inserts bot rows on ``conn`` the way the bot would have created them. ``guild`` and ``trigger`` are
    the Discord ids :meth:`server` and :meth:`world` use when given none (random ones when None)."""

    def __init__(
        self, conn: asyncpg.Connection, *, guild: str | None = None, trigger: str | None = None
    ) -> None:
        self.conn = conn
        self.guild = guild
        self.trigger = trigger

    async def server(
        self, disc_id: str | None = None, *, self_teaching: bool | None = None, personal: bool | None = None
    ) -> int:
        """A ``servers`` row for the guild ``disc_id``, with its member permissions when a flag is given."""
        server_id: int = await self.conn.fetchval(
            "INSERT INTO servers (server_disc_id) VALUES ($1) RETURNING server_id",
            disc_id or self.guild or discord_id(),
        )
        if self_teaching is not None or personal is not None:
            await self.conn.execute(
                "INSERT INTO server_member_permissions_configs"
                " (server_id, self_teaching_enabled, personal_memories_enabled) VALUES ($1, $2, $3)",
                server_id,
                True if self_teaching is None else self_teaching,
                True if personal is None else personal,
            )
        return server_id

    async def persona(
        self,
        server_id: int,
        nickname: str = "Tomori",
        *,
        lineage: int | None = None,
        is_alter: bool = False,
        prefixes: dict[str, str] | None = None,
        suffixes: dict[str, str] | None = None,
        persona_id: int | None = None,
    ) -> tuple[int, int]:
        """A ``personas`` row of ``server_id`` (a new lineage unless ``lineage``; the database's id unless
        ``persona_id``), with its naming config when prefixes or suffixes are given; (persona_id, lineage)."""
        columns = {"server_id": server_id, "persona_nickname": nickname, "is_alter": is_alter}
        if lineage is not None:
            columns["persona_lineage_id"] = lineage
        if persona_id is not None:
            columns["persona_id"] = persona_id
        places = ", ".join(f"${n}" for n in range(1, len(columns) + 1))
        row = await self.conn.fetchrow(
            f"INSERT INTO personas ({', '.join(columns)}) VALUES ({places})"
            " RETURNING persona_id, persona_lineage_id",
            *columns.values(),
        )
        if prefixes is not None or suffixes is not None:
            await self.conn.execute(
                "INSERT INTO persona_naming_configs (persona_id, prefixes, suffixes) VALUES ($1, $2, $3)",
                row["persona_id"],
                json.dumps(prefixes or {}),
                json.dumps(suffixes or {}),
            )
        return int(row["persona_id"]), int(row["persona_lineage_id"])

    async def user(
        self,
        disc_id: str,
        *,
        privacy: int = 0,
        nickname: str | None = None,
        prefix: str | None = None,
        suffix: str | None = None,
        style: str | None = None,
        personalization: bool | None = None,
    ) -> int:
        """A ``users`` row, with its personalization config when any of it is given; its user_id."""
        user_id: int = await self.conn.fetchval(
            "INSERT INTO users (user_disc_id, privacy_level) VALUES ($1, $2) RETURNING user_id",
            disc_id,
            privacy,
        )
        if personalization or nickname is not None or prefix is not None or suffix is not None or style:
            await self.conn.execute(
                "INSERT INTO user_personalization_configs"
                " (user_id, user_nickname, prefix_override, suffix_override, addressing_style)"
                " VALUES ($1, $2, $3, $4, $5)",
                user_id,
                nickname,
                prefix,
                suffix,
                style,
            )
        return user_id

    async def persona_naming(
        self,
        user_id: int,
        lineage: int,
        nickname: str | None = None,
        prefix: str | None = None,
        suffix: str | None = None,
    ) -> None:
        """What a user asked a persona's lineage to call them."""
        await self.conn.execute(
            "INSERT INTO user_persona_naming_preferences"
            " (user_id, persona_lineage_id, nickname_override, prefix_override, suffix_override)"
            " VALUES ($1, $2, $3, $4, $5)",
            user_id,
            lineage,
            nickname,
            prefix,
            suffix,
        )

    async def blacklist(self, server_id: int, disc_id: str) -> None:
        """A user the server keeps out of personalization."""
        await self.conn.execute(
            "INSERT INTO personalization_blacklist (server_id, user_disc_id) VALUES ($1, $2)",
            server_id,
            disc_id,
        )

    async def server_memories(self, server_id: int, lineage: int, n: int) -> None:
        """``n`` server memories of a persona's lineage."""
        await self._memories("server_memories", "server_id", server_id, lineage, n)

    async def personal_memories(self, user_id: int, lineage: int, n: int) -> None:
        """``n`` personal memories of a user with a persona's lineage."""
        await self._memories("personal_memories", "user_id", user_id, lineage, n)

    async def _memories(self, table: str, owner: str, owner_id: int, lineage: int, n: int) -> None:
        await self.conn.execute(
            f"INSERT INTO {table} ({owner}, persona_lineage_id, content)"
            " SELECT $1, $2, 'seeded ' || g FROM generate_series(1, $3) g",
            owner_id,
            lineage,
            n,
        )

    async def world(
        self,
        guild: str | None = None,
        trigger: str | None = None,
        *,
        persona_nickname: str = "Tomori",
        **server_flags: bool | None,
    ) -> World:
        """A server for ``guild``, a persona of it and the triggering user ``trigger`` (each one of this
        seeder's ids when not given); ``server_flags`` as :meth:`server` takes them."""
        guild = guild or self.guild or discord_id()
        trigger = trigger or self.trigger or discord_id()
        server_id = await self.server(guild, **server_flags)
        persona_id, lineage = await self.persona(server_id, persona_nickname)
        trigger_user_id = await self.user(trigger)
        return World(server_id, persona_id, lineage, trigger_user_id, guild, trigger)


async def seed_try_out(postgres_dsn: str, *, persona_nickname: str = "Tomori") -> TryOut:
    """Insert a server, a persona of it, a user and the member Sparrow into the migrated database at
    `postgres_dsn`."""
    import asyncpg

    member_disc_id = discord_id()
    connection = await asyncpg.connect(postgres_dsn, timeout=10)
    try:
        async with connection.transaction():
            rows = BotRows(connection)
            world = await rows.world(persona_nickname=persona_nickname)
            member_user_id = await rows.user(member_disc_id)
    finally:
        await connection.close()
    return TryOut(
        server_id=world.server_id,
        guild_disc_id=world.guild_disc_id,
        persona_id=world.persona_id,
        persona_lineage_id=world.lineage_id,
        user_id=world.trigger_user_id,
        user_disc_id=world.trigger_disc_id,
        channel_disc_id=discord_id(),
        bot_user_disc_id=discord_id(),
        member_user_id=int(member_user_id),
        member_disc_id=member_disc_id,
    )
