"""Builders for test data: raw event bodies (as a shard would write them) and bot rows in Postgres."""

from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg

from contracts.models import ToolCallEvent, ToolResult
from worker.testing import seed
from worker.testing.seed import World

__all__ = [
    "BOT",
    "CHANNEL",
    "GUILD",
    "TRIGGER",
    "BotRows",
    "World",
    "event",
    "event_body",
    "member",
    "participant",
    "published",
]

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


class BotRows(seed.BotRows):
    """The kit's bot-row seeder (worker/testing/seed.py) with this suite's ids: the guild and the triggering
    user :func:`event_body` names."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        super().__init__(conn, guild=GUILD, trigger=TRIGGER)
