"""``resolveUserTarget``: which user ``target_user`` names, by the original's stage ladder.

Pure: the guild is the event's ``guild_members`` (the shard's view of it, standing in for Discord's
member search and fetch) and the database stages read the already loaded ``users``. The bot-self and
bridge fallbacks, and the error sentences, are the caller's business: this module only decides.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from contracts.models import EventContext, GuildMember, Participant
from worker.pipeline.naming import (
    effective_user_name,
    member_display_name,
    member_label,
    participant_label,
    strip_persona_affixes,
)
from worker.pipeline.state import NamingConfig, PersonaState, UserRecord
from worker.pipeline.text import js_trim, normalize_alias

#: A Matrix user id (``@alice:matrix.org``); anchored at the start only, as in the original.
_BRIDGE_USER_ID = re.compile(r"@[^:]+:[^:]+")
#: A bare Discord snowflake (ASCII digits: JS ``\d`` is ASCII-only).
_DISCORD_ID = re.compile(r"[0-9]{17,20}")
#: The model is shown at most this many candidates of an ambiguous name.
MAX_CANDIDATES = 3


@dataclass(frozen=True, slots=True)
class Resolved:
    """The target is one user. ``source`` names the stage that found it (``legacy_id``, ...)."""

    target_id: str
    label: str
    is_bridge: bool
    source: str


@dataclass(frozen=True, slots=True)
class Ambiguous:
    """Several users answer to the name; ``candidates`` are their labels (at most three)."""

    candidates: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NotFound:
    """Nobody answers to the name."""


Resolution = Resolved | Ambiguous | NotFound


@dataclass(frozen=True, slots=True)
class _Candidate:
    target_id: str
    label: str
    is_bridge: bool


def _member_candidate(member: GuildMember) -> _Candidate:
    return _Candidate(member.user_disc_id, member_label(member), is_bridge=False)


def _participant_candidate(participant: Participant) -> _Candidate:
    return _Candidate(participant.target_id, participant_label(participant), participant.is_bridge)


def _first_per_target(candidates: Iterable[_Candidate]) -> list[_Candidate]:
    by_target: dict[str, _Candidate] = {}
    for candidate in candidates:
        by_target.setdefault(candidate.target_id, candidate)
    return list(by_target.values())


def _decide(candidates: Iterable[_Candidate], source: str) -> Resolved | Ambiguous | None:
    """One stage's verdict: ``None`` (nobody, try the next stage), one user, or ambiguous at once."""
    distinct = _first_per_target(candidates)
    if not distinct:
        return None
    if len(distinct) == 1:
        (only,) = distinct
        return Resolved(only.target_id, only.label, only.is_bridge, source)
    return Ambiguous(tuple(candidate.label for candidate in distinct[:MAX_CANDIDATES]))


def _participant_with_id(target_id: str, participants: Sequence[Participant]) -> Resolved | None:
    participant = next((p for p in participants if p.target_id == target_id), None)
    if participant is None:
        return None
    return Resolved(target_id, participant_label(participant), participant.is_bridge, "legacy_id")


def _by_discord_id(discord_id: str, context: EventContext) -> Resolved | NotFound:
    """Stage 1: a bare id is a guild member, else a participant, else nobody (the ladder stops here)."""
    if context.guild_disc_id is not None:
        member = next((m for m in context.guild_members if m.user_disc_id == discord_id), None)
        if member is not None and not member.is_bot:
            return Resolved(discord_id, member_label(member), is_bridge=False, source="legacy_id")
    return _participant_with_id(discord_id, context.participants) or NotFound()


def _by_conversation(wanted: str, participants: Sequence[Participant]) -> Resolved | Ambiguous | None:
    """Stage 2: participants with a matching alias; one matching on its own label beats the rest."""
    matches = [p for p in participants if any(normalize_alias(alias) == wanted for alias in p.aliases)]
    # "Obonya" means the user labelled Obonya, not another user who merely has "Obonya" as an alias.
    primary_ids = {p.target_id for p in matches if normalize_alias(p.display_label) == wanted}
    candidates = _first_per_target(map(_participant_candidate, matches))
    primary = [candidate for candidate in candidates if candidate.target_id in primary_ids]
    return _decide(primary if len(primary) == 1 else candidates, "conversation")


NameOf = Callable[[GuildMember, Mapping[str, UserRecord]], str | None]


def _guild_display_name(member: GuildMember, users: Mapping[str, UserRecord]) -> str | None:
    return member_display_name(member)


def _persona_nickname(member: GuildMember, users: Mapping[str, UserRecord]) -> str | None:
    record = users.get(member.user_disc_id)
    return record.persona_nickname if record is not None else None


def _saved_nickname(member: GuildMember, users: Mapping[str, UserRecord]) -> str | None:
    record = users.get(member.user_disc_id)
    return record.nickname if record is not None else None


def _global_name(member: GuildMember, users: Mapping[str, UserRecord]) -> str | None:
    return member.global_name


def _username(member: GuildMember, users: Mapping[str, UserRecord]) -> str | None:
    return member.username


#: The name ladder (stage 4), in order; the database stages only ever see guild members.
_NAME_LADDER: tuple[tuple[str, NameOf], ...] = (
    ("guild_display_name", _guild_display_name),
    ("persona_nickname", _persona_nickname),
    ("db_nickname", _saved_nickname),
    ("global_name", _global_name),
    ("username", _username),
)


def _by_name_ladder(
    wanted: str, members: Sequence[GuildMember], users: Mapping[str, UserRecord]
) -> Resolved | Ambiguous | None:
    """Stage 4: each name of a guild member in turn; the first stage with a match decides."""
    for source, name_of in _NAME_LADDER:
        matches = []
        for member in members:
            name = name_of(member, users)
            if name and normalize_alias(name) == wanted:
                matches.append(_member_candidate(member))
        verdict = _decide(matches, source)
        if verdict is not None:
            return verdict
    return None


def _by_stripped_name(
    raw: str, members: Sequence[GuildMember], users: Mapping[str, UserRecord], naming: NamingConfig
) -> Resolved | Ambiguous | None:
    """Stage 5: "Master Sparrow" -> "Sparrow" with the persona's own affixes, then the ladder again."""
    stripped = strip_persona_affixes(raw, naming)
    if stripped is None:
        return None
    return _by_name_ladder(normalize_alias(stripped), members, users)


def _composes_to(wanted: str, record: UserRecord | None, naming: NamingConfig) -> bool:
    if record is None or not record.has_personalization:
        return False
    # No live display name: only a stored nickname can carry a composed name.
    composed = effective_user_name(record, naming, live_display_name="")
    return bool(composed) and normalize_alias(composed) == wanted


def _by_composed_name(
    wanted: str, members: Sequence[GuildMember], users: Mapping[str, UserRecord], naming: NamingConfig
) -> Resolved | Ambiguous | None:
    """Stage 6: names built from a user's own prefix/suffix overrides, which stage 5 cannot see."""
    matches = [m for m in members if _composes_to(wanted, users.get(m.user_disc_id), naming)]
    return _decide(map(_member_candidate, matches), "composed_name")


def resolve_target(
    raw_target: str, context: EventContext, persona: PersonaState, users: Mapping[str, UserRecord]
) -> Resolution:
    """``resolveUserTarget``: the user ``raw_target`` names, or why there is none.

    Stages, first decisive one wins (more than one distinct user in a stage is ambiguous at once):
    bridge id, bare Discord id (terminal), conversation participants, then (in a guild only) the
    name ladder over non-bot guild members, the ladder again without the persona's affixes, and
    composed names. ``users`` holds the loaded ``users`` rows keyed by Discord id.
    """
    raw = js_trim(raw_target)
    wanted = normalize_alias(raw_target)
    if not wanted:
        return NotFound()
    if _BRIDGE_USER_ID.match(raw):
        bridge = _participant_with_id(raw, context.participants)
        if bridge is not None:
            return bridge
    if _DISCORD_ID.fullmatch(raw):
        return _by_discord_id(raw, context)
    conversation = _by_conversation(wanted, context.participants)
    if conversation is not None:
        return conversation
    if context.guild_disc_id is None:
        return NotFound()
    members = [member for member in context.guild_members if not member.is_bot]
    return (
        _by_name_ladder(wanted, members, users)
        or _by_stripped_name(raw, members, users, persona.naming)
        or _by_composed_name(wanted, members, users, persona.naming)
        or NotFound()
    )
