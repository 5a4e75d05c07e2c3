"""Shard -> worker: the tool-call event and its ``context`` (the channel, the persona, the webhook to reply
through, the conversation's participants and the guild's members).

Lenient about ``arguments`` (any JSON value, judged later by the pipeline) and about unknown keys (ignored).
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, StrictBool
from pydantic.dataclasses import dataclass as pydantic_dataclass

from contracts.models.fields import (
    MAX_ALIASES,
    MAX_GUILD_MEMBERS,
    MAX_PARTICIPANTS,
    AvatarUrl,
    DiscordId,
    DiscordName,
    EventId,
    InboundSchemaVersion,
    Int4,
    Label,
    Rfc3339,
    TargetId,
    ToolCallId,
    ToolName,
    WebhookUsername,
    _Model,
)


class ReplyVia(_Model):
    """Deliver the notice through this webhook (an alter persona) instead of the channel."""

    webhook_disc_id: DiscordId
    username: WebhookUsername
    avatar_url: AvatarUrl | None = None


# The two lists of an event (dozens of members) are pydantic dataclasses, not models: validated the same,
# built at half the cost (the envelope's parse is a tenth of the worker's CPU; these lists most of it).
_ITEM_CONFIG = ConfigDict(extra="ignore")


@pydantic_dataclass(frozen=True, config=_ITEM_CONFIG)
class Participant:
    """One of the conversation's tool-target references."""

    target_id: TargetId
    display_label: Label
    aliases: list[Label] = Field(default_factory=list, max_length=MAX_ALIASES)
    is_bridge: StrictBool = False


@pydantic_dataclass(frozen=True, config=_ITEM_CONFIG)
class GuildMember:
    """A guild member the shard knows; the worker's only view of the guild."""

    user_disc_id: DiscordId
    username: DiscordName
    global_name: DiscordName | None = None
    nickname: DiscordName | None = None
    is_bot: StrictBool = False


class EventContext(_Model):
    guild_disc_id: DiscordId | None = None
    channel_disc_id: DiscordId
    thread_id: DiscordId | None = None
    triggering_user_disc_id: DiscordId | None = None
    bot_user_disc_id: DiscordId
    persona_id: Int4
    reply_via: ReplyVia | None = None
    participants: list[Participant] = Field(default_factory=list, max_length=MAX_PARTICIPANTS)
    guild_members: list[GuildMember] = Field(default_factory=list, max_length=MAX_GUILD_MEMBERS)

    @property
    def tenant(self) -> str:
        """Whom the turns inside a shard are shared among (CONTRACT.md section 2, "Fair shares"): the guild,
        or for a direct message its channel, ``dm:<channel_disc_id>``."""
        return self.guild_disc_id if self.guild_disc_id is not None else f"dm:{self.channel_disc_id}"


class ToolCallEvent(_Model):
    """Shard -> worker: the model called ``create_long_term_memory`` (or its alias)."""

    schema_version: InboundSchemaVersion
    event_id: EventId
    tool_call_id: ToolCallId
    tool_name: ToolName
    issued_at: Rfc3339
    shard_id: Int4
    #: The model's arguments, verbatim and untrusted: any JSON value (``null`` when absent).
    arguments: Any = None
    context: EventContext
