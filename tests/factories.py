"""Builders for test data: raw event bodies (as a shard would write them) and bot rows in Postgres."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg

from contracts.models import ToolCallEvent, ToolResult

GUILD = "1150000000000000001"
CHANNEL = "1150000000000000100"
TRIGGER = "1150000000000000200"
BOT = "1150000000000000999"


def event_body(
    arguments: Any,
    *,
    persona_id: int,
    guild: str | None = GUILD,
    trigger: str | None = TRIGGER,
    members: list[dict[str, Any]] | None = None,
    participants: list[dict[str, Any]] | None = None,
    reply_via: dict[str, Any] | None = None,
    event_id: str | None = None,
    tool_name: str = "create_long_term_memory",
    shard_id: int = 3,
) -> dict[str, Any]:
    """A tool-call event body exactly as CONTRACT.md shows it."""
    return {
        "schema_version": 1,
        "event_id": event_id or str(uuid.uuid4()),
        "tool_call_id": f"call_{uuid.uuid4().hex[:8]}",
        "tool_name": tool_name,
        "issued_at": "2026-12-02T08:00:00Z",
        "shard_id": shard_id,
        "arguments": arguments,
        "context": {
            "guild_disc_id": guild,
            "channel_disc_id": CHANNEL,
            "thread_id": None,
            "triggering_user_disc_id": trigger,
            "bot_user_disc_id": BOT,
            "persona_id": persona_id,
            "reply_via": reply_via,
            "participants": participants or [],
            "guild_members": members or [],
        },
    }


def event(arguments: Any, **kwargs: Any) -> ToolCallEvent:
    """The parsed event for :func:`event_body`."""
    return ToolCallEvent.model_validate_json(json.dumps(event_body(arguments, **kwargs)))


def published(result: ToolResult) -> dict[str, Any]:
    """A tool result as the publisher serialises it (the JSON a shard receives)."""
    return result.model_dump(mode="json")


def member(
    disc_id: str,
    username: str,
    global_name: str | None = None,
    nickname: str | None = None,
    is_bot: bool = False,
) -> dict[str, Any]:
    return {
        "user_disc_id": disc_id,
        "username": username,
        "global_name": global_name,
        "nickname": nickname,
        "is_bot": is_bot,
    }


def participant(target_id: str, label: str, aliases: list[str], is_bridge: bool = False) -> dict[str, Any]:
    return {"target_id": target_id, "display_label": label, "aliases": aliases, "is_bridge": is_bridge}


@dataclass
class World:
    """A seeded server with one persona and a triggering user."""

    server_id: int
    persona_id: int
    lineage_id: int
    trigger_user_id: int


class BotRows:
    """Inserts bot rows the way the bot would have created them."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    async def server(
        self, disc_id: str = GUILD, *, self_teaching: bool | None = None, personal: bool | None = None
    ) -> int:
        server_id: int = await self.conn.fetchval(
            "INSERT INTO servers (server_disc_id) VALUES ($1) RETURNING server_id", disc_id
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
    ) -> tuple[int, int]:
        if lineage is None:
            row = await self.conn.fetchrow(
                "INSERT INTO personas (server_id, persona_nickname, is_alter) VALUES ($1, $2, $3)"
                " RETURNING persona_id, persona_lineage_id",
                server_id,
                nickname,
                is_alter,
            )
        else:
            row = await self.conn.fetchrow(
                "INSERT INTO personas (server_id, persona_nickname, is_alter, persona_lineage_id)"
                " VALUES ($1, $2, $3, $4) RETURNING persona_id, persona_lineage_id",
                server_id,
                nickname,
                is_alter,
                lineage,
            )
        if prefixes is not None or suffixes is not None:
            await self.conn.execute(
                "INSERT INTO persona_naming_configs (persona_id, prefixes, suffixes) VALUES ($1, $2, $3)",
                row["persona_id"],
                json.dumps(prefixes or {}),
                json.dumps(suffixes or {}),
            )
        return row["persona_id"], row["persona_lineage_id"]

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
        await self.conn.execute(
            "INSERT INTO personalization_blacklist (server_id, user_disc_id) VALUES ($1, $2)",
            server_id,
            disc_id,
        )

    async def server_memories(self, server_id: int, lineage: int, n: int) -> None:
        await self.conn.execute(
            "INSERT INTO server_memories (server_id, persona_lineage_id, content)"
            " SELECT $1, $2, 'seeded ' || g FROM generate_series(1, $3) g",
            server_id,
            lineage,
            n,
        )

    async def personal_memories(self, user_id: int, lineage: int, n: int) -> None:
        await self.conn.execute(
            "INSERT INTO personal_memories (user_id, persona_lineage_id, content)"
            " SELECT $1, $2, 'seeded ' || g FROM generate_series(1, $3) g",
            user_id,
            lineage,
            n,
        )

    async def world(self, **server_flags: bool | None) -> World:
        server_id = await self.server(**server_flags)
        persona_id, lineage = await self.persona(server_id)
        trigger_user_id = await self.user(TRIGGER)
        return World(server_id, persona_id, lineage, trigger_user_id)
