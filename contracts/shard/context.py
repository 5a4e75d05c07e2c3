"""The event's ``context`` (CONTRACT.md section 3) from plain data: the Python twin of the TypeScript kit's
``buildContext`` (its README, "Building the context"), with the same parameters in Python's spelling.

``build_context(guild_id=..., channel_id=..., user_id=..., bot_user_id=..., persona_id=...,
participants=[...], members=[...])`` returns the context as the JSON object the contract shows (a dict, ready
for ``LtmClient.create_memory(context=...)``). Discord ids must be 17 to 20 digits (:class:`InvalidEventError`
names the field otherwise); a participant's ``target_id`` may be a bridge id. More than 1,000 members are cut
(the contract's limit): members who are participants come first, then the triggering user, then the others in
the order given, duplicates removed. The author is not added for you: put them in ``members``, or the notice
names them by their bare Discord id. The result is checked against the contract's model before it is returned,
so a bound the shard broke (a name over 32 characters, more than 100 participants) fails here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from contracts.models import MAX_GUILD_MEMBERS, EventContext
from contracts.shard.errors import InvalidEventError

__all__ = ["MAX_GUILD_MEMBERS", "MemberInput", "ParticipantInput", "ReplyViaInput", "build_context"]

_SNOWFLAKE = re.compile(r"[0-9]{17,20}")


@dataclass(frozen=True)
class MemberInput:
    """A guild member as the shard knows it (discord.py: ``member.id``, ``.name``, ``.global_name``,
    ``.nick``, ``.bot``)."""

    user_id: str
    username: str
    global_name: str | None = None
    nickname: str | None = None
    is_bot: bool = False


@dataclass(frozen=True)
class ParticipantInput:
    """One of the conversation's tool-target references."""

    #: a Discord id, or a bridge user's id (e.g. ``@alice:matrix.org``)
    target_id: str
    display_label: str
    aliases: tuple[str, ...] = field(default=())
    #: true for a bridged (non-Discord) user
    is_bridge: bool = False


@dataclass(frozen=True)
class ReplyViaInput:
    """Deliver the notice through this webhook (an alter persona)."""

    webhook_id: str
    username: str
    avatar_url: str | None = None


def _snowflake(name: str, value: object) -> str:
    if not isinstance(value, str) or _SNOWFLAKE.fullmatch(value) is None:
        raise InvalidEventError(f"{name} must be a Discord id (17 to 20 digits), got {value!r}")
    return value


def _optional_snowflake(name: str, value: object) -> str | None:
    return None if value is None else _snowflake(name, value)


def build_context(
    *,
    guild_id: str | None,
    channel_id: str,
    user_id: str | None,
    bot_user_id: str,
    persona_id: int,
    thread_id: str | None = None,
    reply_via: ReplyViaInput | None = None,
    participants: Iterable[ParticipantInput] = (),
    members: Iterable[MemberInput] = (),
) -> dict[str, Any]:
    """The event's ``context``, validated, with ``guild_members`` capped at 1,000.

    ``guild_id`` is None in a DM, ``thread_id`` set when the turn is inside a thread, ``user_id`` the
    message's author (None only if unknown), ``persona_id`` the ``personas.persona_id`` of the persona that
    answers. ``members`` go most relevant first (e.g. recent speakers).
    """
    if isinstance(persona_id, bool) or not isinstance(persona_id, int) or persona_id < 0:
        raise InvalidEventError(f"persona_id must be an integer >= 0, got {persona_id!r}")
    chosen_participants: list[dict[str, Any]] = []
    for index, participant in enumerate(participants):
        if not isinstance(participant.target_id, str) or not participant.target_id:
            raise InvalidEventError(f"participants[{index}].target_id must be a non-empty string")
        chosen_participants.append(
            {
                "target_id": participant.target_id,
                "display_label": participant.display_label,
                "aliases": list(participant.aliases),
                "is_bridge": participant.is_bridge,
            }
        )
    author = _optional_snowflake("user_id", user_id)
    via: dict[str, Any] | None = None
    if reply_via is not None:
        via = {
            "webhook_disc_id": _snowflake("reply_via.webhook_id", reply_via.webhook_id),
            "username": reply_via.username,
            "avatar_url": reply_via.avatar_url,
        }
    context = {
        "guild_disc_id": _optional_snowflake("guild_id", guild_id),
        "channel_disc_id": _snowflake("channel_id", channel_id),
        "thread_id": _optional_snowflake("thread_id", thread_id),
        "triggering_user_disc_id": author,
        "bot_user_disc_id": _snowflake("bot_user_id", bot_user_id),
        "persona_id": persona_id,
        "reply_via": via,
        "participants": chosen_participants,
        "guild_members": _select_members(list(members), chosen_participants, author),
    }
    try:
        EventContext.model_validate(context)
    except ValidationError as error:
        raise InvalidEventError(f"the context is not the contract's: {error}") from None
    return context


def _select_members(
    given: list[MemberInput], participants: list[dict[str, Any]], author: str | None
) -> list[dict[str, Any]]:
    """Participants' members first, then the triggering user, then the rest in order; no duplicates."""
    by_id: dict[str, dict[str, Any]] = {}
    for index, member in enumerate(given):
        member_id = _snowflake(f"members[{index}].user_id", member.user_id)
        if not isinstance(member.username, str):
            raise InvalidEventError(f"members[{index}].username must be a string")
        by_id.setdefault(
            member_id,
            {
                "user_disc_id": member_id,
                "username": member.username,
                "global_name": member.global_name,
                "nickname": member.nickname,
                "is_bot": member.is_bot,
            },
        )
    chosen: dict[str, dict[str, Any]] = {}
    first = [p["target_id"] for p in participants] + ([author] if author is not None else [])
    for member_id in [*first, *by_id]:
        if len(chosen) >= MAX_GUILD_MEMBERS:
            break
        if member_id in by_id:
            chosen.setdefault(member_id, by_id[member_id])
    return list(chosen.values())
