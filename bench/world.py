"""The bench's population: servers, personas, users and every name they go by. Plain data, no I/O.

Built deterministically from a seed, so the worker's database and the Postgres ceiling's database are
seeded identically (ids are assigned here, not by the database) and the workload knows up front what
each event must end as.

Names are built so that one name string never belongs to two users by accident: a user's base name is a
run of consonant-vowel syllables ("Kamira"), unique per user, and every other name of theirs decorates
that base in a way no other name form does ("Kamira the Bold", "Kamira-chan", "Little Kamira",
"kamira_17"). Persona and bridge names start with a vowel and unknown names with a consonant cluster,
so none of them can equal a user's name. The only shared name is the one the two "twins" of each server
carry on purpose, for the ambiguous-name events.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from worker.config import Limits

SYLLABLES = tuple(c + v for c in "bdgkmnprstvz" for v in "aeiou")
PERSONA_NAMES = ("Aiko", "Ember", "Astra", "Iris", "Oboro", "Elle", "Aurora", "Echo", "Ione", "Umi")
BRIDGE_NAMES = ("Alice", "Emma", "Oscar", "Ivy", "Uma", "Eli", "Ada", "Otto")
TWIN_NAMES = ("Shadow", "Sleepy", "Crow", "Storm", "Pixel", "Glitch", "Frost", "Spark")
EPITHETS = ("the Bold", "the Quiet", "the Brave", "the Wise", "of the North", "the Baker")
NICKNAME_TAGS = ("chan", "kun", "san", "bun", "pie")
PERSONA_NICKNAME_WORDS = ("Little", "Big", "Tiny", "Grand")
PREFIX_OVERRIDES = ("Captain", "Doctor", "Sensei", "Professor")
STYLES = ("masculine", "feminine", "neutral", None)
PERSONA_PREFIXES = {"masculine": "Master", "feminine": "Lady", "neutral": "Dear"}
PERSONA_SUFFIXES = {"neutral": "-sama"}

BOT_DISC_ID = "1149999999999999999"
GUILD_ID_BASE = 1_150_000_000_000_000_000
USER_ID_BASE = 1_170_000_000_000_000_000
WEBHOOK_ID_BASE = 1_190_000_000_000_000_000
#: persona lineages come from ``persona_lineage_id_seq``, which starts at 10000
FIRST_LINEAGE = 10000


@dataclass(frozen=True, slots=True)
class User:
    """A Discord user the shards know; ``has_row`` says whether the bot has a ``users`` row for them."""

    user_id: int
    disc_id: str
    base: str
    username: str
    global_name: str | None
    has_row: bool
    privacy: int
    #: ``user_personalization_configs`` (``personalization`` says whether that row exists)
    personalization: bool
    db_nickname: str | None
    prefix_override: str | None
    suffix_override: str | None
    addressing_style: str | None


@dataclass(frozen=True, slots=True)
class Member:
    """A user as a member of one guild, with that guild's nickname."""

    user: User
    guild_nickname: str | None

    @property
    def display_name(self) -> str:
        return self.guild_nickname or self.user.global_name or self.user.username

    def as_guild_member(self) -> dict[str, Any]:
        return {
            "user_disc_id": self.user.disc_id,
            "username": self.user.username,
            "global_name": self.user.global_name,
            "nickname": self.guild_nickname,
            "is_bot": False,
        }

    def as_participant(self) -> dict[str, Any]:
        aliases = list(dict.fromkeys(a for a in (self.display_name, self.user.username) if a))
        return {
            "target_id": self.user.disc_id,
            "display_label": self.display_name,
            "aliases": aliases,
            "is_bridge": False,
        }


@dataclass(frozen=True, slots=True)
class Persona:
    persona_id: int
    lineage_id: int
    nickname: str
    is_alter: bool
    prefixes: Mapping[str, str]
    suffixes: Mapping[str, str]
    webhook_disc_id: str | None

    def reply_via(self) -> dict[str, Any] | None:
        if not self.is_alter or self.webhook_disc_id is None:
            return None
        return {
            "webhook_disc_id": self.webhook_disc_id,
            "username": self.nickname,
            "avatar_url": f"https://cdn.example.invalid/avatars/{self.persona_id}.png",
        }


@dataclass(frozen=True)  # no slots: ``guild_members`` is cached on the instance
class Server:
    server_id: int
    disc_id: str
    self_teaching: bool
    personal_enabled: bool
    personas: tuple[Persona, ...]
    members: tuple[Member, ...]
    #: the two members that share a guild nickname on purpose (ambiguous-name events)
    twins: tuple[str, ...]
    twin_name: str | None
    blacklisted: tuple[str, ...]
    channels: tuple[str, ...]

    @cached_property
    def guild_members(self) -> list[dict[str, Any]]:
        """The event's ``guild_members``: every member the shard knows, the bot included."""
        bot = {
            "user_disc_id": BOT_DISC_ID,
            "username": "tomori",
            "global_name": "Tomori",
            "nickname": self.personas[0].nickname,
            "is_bot": True,
        }
        return [m.as_guild_member() for m in self.members] + [bot]


@dataclass(frozen=True, slots=True)
class World:
    """Everything the bench seeds before the first event, and the names events may use."""

    seed: int
    servers: tuple[Server, ...]
    users: tuple[User, ...]
    #: ``user_persona_naming_preferences.nickname_override`` by (user_id, lineage)
    persona_nicknames: Mapping[tuple[int, int], str]
    #: memories already there before the run (background), by scope
    server_memories: Mapping[tuple[int, int], int] = field(default_factory=dict)
    personal_memories: Mapping[tuple[int, int], int] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return {
            "servers": len(self.servers),
            "personas": sum(len(s.personas) for s in self.servers),
            "users": len(self.users),
            "users_with_row": sum(1 for u in self.users if u.has_row),
            "memberships": sum(len(s.members) for s in self.servers),
        }


def base_name(number: int) -> str:
    """A unique consonant-vowel name for ``number`` (three syllables, then four, ...)."""
    parts = []
    n = number
    for _ in range(3):
        parts.append(SYLLABLES[n % len(SYLLABLES)])
        n //= len(SYLLABLES)
    while n:
        parts.append(SYLLABLES[n % len(SYLLABLES)])
        n //= len(SYLLABLES)
    return "".join(parts).capitalize()


def build_world(
    *,
    seed: int,
    servers: int,
    personas_per_server: int,
    users: int,
    members_per_server: int,
    limits: Limits,
) -> World:
    """The population for ``seed``: same arguments, same world, ids included."""
    if servers < 1 or users < 4 or personas_per_server < 1:
        raise ValueError("the bench needs at least 1 server, 1 persona per server and 4 users")
    rng = random.Random(f"world:{seed}")
    name_numbers = rng.sample(range(len(SYLLABLES) ** 3 * 4), users)
    all_users = tuple(_user(i, name_numbers[i], rng) for i in range(users))
    persona_nicknames: dict[tuple[int, int], str] = {}
    server_memories: dict[tuple[int, int], int] = {}
    personal_memories: dict[tuple[int, int], int] = {}
    built: list[Server] = []
    disabled = set(rng.sample(range(servers), servers // 30)) if servers >= 30 else set()
    next_persona, next_lineage = 1, FIRST_LINEAGE
    for index in range(servers):
        server_id = index + 1
        personas = []
        names = rng.sample(PERSONA_NAMES, min(personas_per_server, len(PERSONA_NAMES)))
        for k in range(personas_per_server):
            named = rng.random() < 0.6
            persona_name = names[k] if k < len(names) else f"{names[k % len(names)]} {k}"
            personas.append(
                Persona(
                    persona_id=next_persona,
                    lineage_id=next_lineage,
                    nickname=persona_name,
                    is_alter=k > 0,
                    prefixes=dict(PERSONA_PREFIXES) if named else {},
                    suffixes=dict(PERSONA_SUFFIXES) if named and rng.random() < 0.5 else {},
                    webhook_disc_id=str(WEBHOOK_ID_BASE + next_persona) if k > 0 else None,
                )
            )
            next_persona += 1
            next_lineage += 1
        chosen = rng.sample(all_users, min(members_per_server, users))
        twins = tuple(u.disc_id for u in chosen[:2]) if len(chosen) >= 6 else ()
        twin_name = TWIN_NAMES[index % len(TWIN_NAMES)] if twins else None
        members = []
        for user in chosen:
            if user.disc_id in twins:
                nickname: str | None = twin_name
            elif rng.random() < 0.4:
                nickname = f"{user.base} {rng.choice(EPITHETS)}"
            else:
                nickname = None
            members.append(Member(user, nickname))
            if user.has_row and user.disc_id not in twins:
                for persona in personas:
                    key = (user.user_id, persona.lineage_id)
                    if rng.random() < 0.15:
                        persona_nicknames[key] = f"{rng.choice(PERSONA_NICKNAME_WORDS)} {user.base}"
                    if rng.random() < 0.3:
                        personal_memories[key] = rng.randint(1, max(1, limits.max_personal_memories // 10))
        for persona in personas:
            server_memories[(server_id, persona.lineage_id)] = rng.randint(
                0, max(0, limits.max_server_memories // 5)
            )
        blacklisted = tuple(
            m.user.disc_id for m in members if m.user.disc_id not in twins and rng.random() < 0.03
        )
        guild = GUILD_ID_BASE + server_id * 1000
        built.append(
            Server(
                server_id=server_id,
                disc_id=str(guild),
                self_teaching=index not in disabled,
                personal_enabled=rng.random() >= 0.05,
                personas=tuple(personas),
                members=tuple(members),
                twins=twins,
                twin_name=twin_name,
                blacklisted=blacklisted,
                channels=tuple(str(guild + 100 + c) for c in range(3)),
            )
        )
    for user in all_users:
        if user.has_row and rng.random() < 0.1:
            personal_memories[(user.user_id, 0)] = rng.randint(1, 3)
    return World(
        seed=seed,
        servers=tuple(built),
        users=all_users,
        persona_nicknames=persona_nicknames,
        server_memories=server_memories,
        personal_memories=personal_memories,
    )


def _user(index: int, name_number: int, rng: random.Random) -> User:
    base = base_name(name_number)
    has_row = rng.random() >= 0.08
    personalization = has_row and rng.random() < 0.35
    db_nickname = f"{base}-{rng.choice(NICKNAME_TAGS)}" if personalization and rng.random() < 0.8 else None
    prefix = rng.choice(PREFIX_OVERRIDES) if personalization and rng.random() < 0.35 else None
    roll = rng.random()
    privacy = 0 if roll >= 0.06 else (1 if roll >= 0.02 else 2)
    return User(
        user_id=index + 1,
        disc_id=str(USER_ID_BASE + index * 37),
        base=base,
        username=f"{base.lower()}_{rng.randint(10, 99)}",
        global_name=base if rng.random() < 0.85 else None,
        has_row=has_row,
        privacy=privacy,
        personalization=personalization,
        db_nickname=db_nickname,
        prefix_override=prefix,
        suffix_override=None,
        addressing_style=rng.choice(STYLES) if personalization else None,
    )
