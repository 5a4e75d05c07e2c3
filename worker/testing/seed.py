"""Bot rows for a try-out: a server (guild), a persona, the triggering user and a second member "Sparrow", as
the bot itself would have created them, and tool-call events that name them (CONTRACT.md section 3).

Each call makes a new guild and users with random Discord ids, so tests sharing one database never meet.
The seed is the TypeScript stack's (`seed()` of `@tomoribot/ltm-client/testing`): Sparrow is in the event's
context as a participant and a guild member, so a personal memory (`"memory_scope": "target_user",
"target_user": "Sparrow"`) is saved as it would be in the bot.
"""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from contracts.shard.context import MemberInput, ParticipantInput, build_context

__all__ = ["MEMBER_LABEL", "MEMBER_USERNAME", "TryOut", "discord_id", "seed_try_out"]

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


async def seed_try_out(postgres_dsn: str, *, persona_nickname: str = "Tomori") -> TryOut:
    """Insert a server, a persona of it, a user and the member Sparrow into the migrated database at
    `postgres_dsn`."""
    import asyncpg

    guild, user_disc_id, member_disc_id = discord_id(), discord_id(), discord_id()
    connection = await asyncpg.connect(postgres_dsn, timeout=10)
    try:
        async with connection.transaction():
            server_id = await connection.fetchval(
                "INSERT INTO servers (server_disc_id) VALUES ($1) RETURNING server_id", guild
            )
            persona = await connection.fetchrow(
                "INSERT INTO personas (server_id, persona_nickname) VALUES ($1, $2)"
                " RETURNING persona_id, persona_lineage_id",
                server_id,
                persona_nickname,
            )
            add_user = "INSERT INTO users (user_disc_id) VALUES ($1) RETURNING user_id"
            user_id = await connection.fetchval(add_user, user_disc_id)
            member_user_id = await connection.fetchval(add_user, member_disc_id)
    finally:
        await connection.close()
    return TryOut(
        server_id=int(server_id),
        guild_disc_id=guild,
        persona_id=int(persona["persona_id"]),
        persona_lineage_id=int(persona["persona_lineage_id"]),
        user_id=int(user_id),
        user_disc_id=user_disc_id,
        channel_disc_id=discord_id(),
        bot_user_disc_id=discord_id(),
        member_user_id=int(member_user_id),
        member_disc_id=member_disc_id,
    )
