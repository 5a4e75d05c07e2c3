"""Per category, one event's draft (or a contested burst's) and the status it must end as; every scope's
room tracked, so that a normal save never reaches a limit."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

from bench.workload_mix import (
    AMBIGUOUS,
    CONTESTED_BURST,
    CONTESTED_ROOM,
    DAYS,
    DISABLED,
    INTERNAL,
    INVALID_ARGS,
    INVALID_CONTENT,
    LIMIT_EXCEEDED,
    NOT_FOUND,
    PRIVACY,
    SAVED,
    THINGS,
    TOOL,
    UNKNOWN_NAMES,
    WorldTooSmall,
)
from bench.world import BOT_DISC_ID, BRIDGE_NAMES, Member, Persona, Server, World
from worker.config import Limits
from worker.pipeline.naming import effective_user_name
from worker.pipeline.state import NamingConfig, UserRecord


@dataclass(frozen=True, slots=True)
class _Draft:
    server: Server
    persona: Persona
    trigger: str
    arguments: Any
    expected: str | None
    participants: tuple[dict[str, Any], ...] = ()
    contested: tuple[int, int] | None = None
    tool_name: str = TOOL


class _Generator:
    def __init__(self, world: World, limits: Limits, rng: random.Random) -> None:
        self.world = world
        self.limits = limits
        self.rng = rng
        self.enabled = [s for s in world.servers if s.self_teaching]
        self.disabled = [s for s in world.servers if not s.self_teaching]
        if not self.enabled:
            raise WorldTooSmall("every server has self-teaching disabled")
        self.server_memories: dict[tuple[int, int], int] = dict(world.server_memories)
        self.personal_memories: dict[tuple[int, int], int] = dict(world.personal_memories)
        self.extra_server: dict[tuple[int, int], int] = {}
        self.extra_personal: dict[tuple[int, int], int] = {}
        self.planned: Counter[tuple[str, int, int]] = Counter()
        self.reserved: set[tuple[str, int, int]] = set()
        self.full_server: list[tuple[Server, Persona]] = []
        self.full_personal: list[tuple[Server, Persona, Member]] = []
        self.contested_open: list[tuple[Server, Persona, Member, int]] = []
        #: contested scope -> free slots at the start of the run
        self.contested_room: dict[tuple[int, int], int] = {}

    # -- who may do what ---------------------------------------------------------------------------

    def eligible(self, server: Server) -> list[Member]:
        """Members a personal save can target: known, privacy 0, not a twin."""
        return [
            m
            for m in server.members
            if m.user.has_row and m.user.privacy == 0 and m.user.disc_id not in server.twins
        ]

    def triggers(self, server: Server) -> list[Member]:
        return [m for m in server.members if m.user.has_row and m.user.disc_id not in server.twins]

    def pick_place(self) -> tuple[Server, Persona, Member]:
        server = self.rng.choice(self.enabled)
        persona = self.rng.choice(server.personas)
        return server, persona, self.rng.choice(self.triggers(server))

    def personal_room(self, user_id: int, lineage: int) -> int:
        used = self.personal_memories.get((user_id, lineage), 0) + self.personal_memories.get((user_id, 0), 0)
        return self.limits.max_personal_memories - used - self.planned[("personal", user_id, lineage)]

    def server_room(self, server_id: int, lineage: int) -> int:
        used = self.server_memories.get((server_id, lineage), 0)
        return self.limits.max_server_memories - used - self.planned[("server", server_id, lineage)]

    def participants(self, server: Server, trigger: Member, persona: Persona) -> list[dict[str, Any]]:
        """The trigger, up to two other members of the conversation, and the bot."""
        others = [m for m in self.eligible(server) if m.user.disc_id != trigger.user.disc_id]
        chosen = self.rng.sample(others, min(len(others), self.rng.randint(0, 2)))
        bot = {
            "target_id": BOT_DISC_ID,
            "display_label": persona.nickname,
            "aliases": [persona.nickname],
            "is_bridge": False,
        }
        return [trigger.as_participant(), *(m.as_participant() for m in chosen), bot]

    # -- content ----------------------------------------------------------------------------------

    def content(self, personal: bool) -> str:
        rng = self.rng
        thing, other = rng.sample(THINGS, 2)
        if personal:
            text = rng.choice(
                (
                    f"{{user}} likes {thing}",
                    f"{{user}} prefers {thing} over {other}",
                    f"{{user}} is learning about {thing} and asks {{bot}} for tips every {rng.choice(DAYS)}",
                    f"{{user}} said their {{favourite}} hobby is {thing}",
                    f"{{user}} does not like {thing} 🙅",
                )
            )
        else:
            text = rng.choice(
                (
                    f"The server's {thing} night is on {rng.choice(DAYS)}",
                    f"{{user}} told {{bot}} that this server loves {thing}",
                    f"Members here argue about {thing} versus {other} a lot",
                    f"{{bot}} should recommend {thing} when someone is bored",
                    f"The weekly event is about {thing} 🎉",
                )
            )
        if rng.random() < 0.05:
            text = " ".join([text] * rng.randint(8, 14))[: rng.randint(600, 950)]
        return text

    def too_long(self) -> str:
        sentence = f"{self.content(False)}. "
        return (sentence * (self.limits.max_memory_length // len(sentence) + 2))[
            : self.limits.max_memory_length + self.rng.randint(1, 200)
        ]

    # -- categories ----------------------------------------------------------------------------------

    def server_save(self, category: str) -> _Draft | None:
        for _ in range(20):
            server, persona, trigger = self.pick_place()
            key = ("server", server.server_id, persona.lineage_id)
            if key in self.reserved or self.server_room(server.server_id, persona.lineage_id) <= 0:
                continue
            participants = self.participants(server, trigger, persona)
            arguments: dict[str, Any] = {"memory_content": self.content(False), "memory_scope": "server_wide"}
            if category == "bridge_user":
                name = self.rng.choice(BRIDGE_NAMES)
                bridge_id = f"@{name.lower()}:matrix.org"
                participants.append(
                    {"target_id": bridge_id, "display_label": name, "aliases": [name], "is_bridge": True}
                )
                arguments = {
                    "memory_content": f"{{user}} likes {self.rng.choice(THINGS)}",
                    "memory_scope": "target_user",
                    "target_user": bridge_id if self.rng.random() < 0.5 else name,
                }
            elif category == "bot_itself":
                arguments = {
                    "memory_content": f"{{bot}} likes {self.rng.choice(THINGS)}",
                    "memory_scope": "target_user",
                    "target_user": persona.nickname if self.rng.random() < 0.7 else BOT_DISC_ID,
                }
            self.planned[key] += 1
            return _Draft(server, persona, trigger.user.disc_id, arguments, SAVED, tuple(participants))
        raise WorldTooSmall("no server-wide scope has room left: raise --servers or --personas")

    def personal_save(self, category: str) -> _Draft | None:
        for _ in range(20):
            server, persona, trigger = self.pick_place()
            candidates = []
            for member in self.eligible(server):
                name = self.name_for(category, member, persona)
                key = ("personal", member.user.user_id, persona.lineage_id)
                if name is None or key in self.reserved:
                    continue
                if self.personal_room(member.user.user_id, persona.lineage_id) > 0:
                    candidates.append((member, name))
            if not candidates:
                continue
            target, name = self.rng.choice(candidates)
            participants = self.participants(server, trigger, persona)
            if category == "personal_conversation" and not any(
                p["target_id"] == target.user.disc_id for p in participants
            ):
                participants.insert(1, target.as_participant())
            self.planned[("personal", target.user.user_id, persona.lineage_id)] += 1
            target_key = "target_user"
            if category == "personal_discord_id" and self.rng.random() < 0.5:
                target_key = "target_user_discord_id"
            elif category == "personal_display_name" and self.rng.random() < 0.1:
                target_key = "target_user_nickname"
            arguments = {
                "memory_content": self.content(True),
                "memory_scope": "target_user",
                target_key: name,
            }
            if self.rng.random() < 0.05:
                arguments["importance"] = "high"  # unknown keys are ignored
            return _Draft(server, persona, trigger.user.disc_id, arguments, SAVED, tuple(participants))
        return None

    def name_for(self, category: str, member: Member, persona: Persona) -> str | None:
        """The name that reaches ``member`` through the ladder stage ``category`` exercises."""
        user = member.user
        if category == "personal_discord_id":
            return user.disc_id
        if category in ("personal_conversation", "personal_display_name"):
            return member.display_name
        if category == "personal_persona_nickname":
            return self.world.persona_nicknames.get((user.user_id, persona.lineage_id))
        if category == "personal_saved_nickname":
            return user.db_nickname
        if category == "personal_global_name":
            return user.global_name if member.guild_nickname and user.global_name else None
        if category == "personal_username":
            if member.display_name.lower() == user.username.lower():
                return None
            return ("@" if self.rng.random() < 0.3 else "") + user.username
        if category == "personal_persona_affix":
            if persona.prefixes:
                return f"{self.rng.choice(list(persona.prefixes.values()))} {member.display_name}"
            if persona.suffixes:
                return f"{member.display_name}{next(iter(persona.suffixes.values()))}"
            return None
        if category == "personal_composed_name":
            if not user.personalization or user.prefix_override is None:
                return None
            record = UserRecord(
                user_id=user.user_id,
                user_disc_id=user.disc_id,
                has_personalization=True,
                nickname=user.db_nickname,
                prefix_override=user.prefix_override,
                suffix_override=user.suffix_override,
                addressing_style=user.addressing_style,
                persona_nickname=self.world.persona_nicknames.get((user.user_id, persona.lineage_id)),
            )
            naming = NamingConfig(prefixes=persona.prefixes, suffixes=persona.suffixes)
            return effective_user_name(record, naming) or None
        raise AssertionError(category)

    def server_limit(self) -> _Draft:
        if not self.full_server or (len(self.full_server) < 8 and self.rng.random() < 0.1):
            for _ in range(50):
                server, persona, _trigger = self.pick_place()
                key = ("server", server.server_id, persona.lineage_id)
                if key in self.reserved or self.planned[key]:
                    continue
                self.reserved.add(key)
                scope = (server.server_id, persona.lineage_id)
                self.extra_server[scope] = self.limits.max_server_memories - self.server_memories.get(
                    scope, 0
                )
                self.full_server.append((server, persona))
                break
        if not self.full_server:
            raise WorldTooSmall("no server-wide scope left to fill up: raise --servers")
        server, persona = self.rng.choice(self.full_server)
        trigger = self.rng.choice(self.triggers(server))
        arguments = {"memory_content": self.content(False), "memory_scope": "server_wide"}
        participants = self.participants(server, trigger, persona)
        return _Draft(server, persona, trigger.user.disc_id, arguments, LIMIT_EXCEEDED, tuple(participants))

    def take_personal_scope(self) -> tuple[Server, Persona, Member] | None:
        """A personal scope nobody else uses, reserved for a limit scenario."""
        for _ in range(50):
            server, persona, _trigger = self.pick_place()
            members = self.eligible(server)
            if not members:
                continue
            member = self.rng.choice(members)
            key = ("personal", member.user.user_id, persona.lineage_id)
            if key in self.reserved or self.planned[key]:
                continue
            self.reserved.add(key)
            return server, persona, member
        return None

    def personal_limit(self) -> _Draft:
        if not self.full_personal or (len(self.full_personal) < 16 and self.rng.random() < 0.1):
            taken = self.take_personal_scope()
            if taken is not None:
                server, persona, member = taken
                scope = (member.user.user_id, persona.lineage_id)
                self.extra_personal[scope] = max(0, self.personal_room(*scope))
                self.full_personal.append(taken)
        if not self.full_personal:
            raise WorldTooSmall("no personal scope left to fill up: raise --users or --servers")
        server, persona, member = self.rng.choice(self.full_personal)
        return self.personal_at(server, persona, member, LIMIT_EXCEEDED, None)

    def personal_at(
        self, server: Server, persona: Persona, target: Member, expected: str | None, contested: Any
    ) -> _Draft:
        trigger = self.rng.choice(self.triggers(server))
        arguments = {
            "memory_content": self.content(True),
            "memory_scope": "target_user",
            "target_user": target.display_name,
        }
        participants = self.participants(server, trigger, persona)
        return _Draft(
            server, persona, trigger.user.disc_id, arguments, expected, tuple(participants), contested
        )

    def contested_limit(self) -> list[_Draft]:
        """A burst of events racing for the last few slots of one personal scope."""
        taken = self.take_personal_scope()
        if taken is None:
            raise WorldTooSmall("no personal scope left to contest: raise --users or --servers")
        server, persona, member = taken
        scope = (member.user.user_id, persona.lineage_id)
        room = self.personal_room(*scope)
        self.extra_personal[scope] = max(0, room - CONTESTED_ROOM)
        self.contested_room[scope] = room - self.extra_personal[scope]
        return [self.personal_at(server, persona, member, None, scope) for _ in range(CONTESTED_BURST)]

    def failure(self, category: str) -> _Draft | None:
        rng = self.rng
        server, persona, trigger = self.pick_place()
        participants = self.participants(server, trigger, persona)
        who = trigger.user.disc_id
        if category == "invalid_args":
            content = self.content(False)
            arguments = rng.choice(
                (
                    ["remember", content],
                    content,
                    {"memory_scope": "server_wide"},
                    {"memory_content": content, "memory_scope": "global"},
                    {"memory_content": 42, "memory_scope": "server_wide"},
                    {"memory_content": content, "memory_scope": "target_user"},
                    {"memory_content": "   ", "memory_scope": "server_wide"},
                )
            )
            return _Draft(server, persona, who, arguments, INVALID_ARGS, tuple(participants))
        if category == "too_long":
            arguments = {"memory_content": self.too_long(), "memory_scope": "server_wide"}
            return _Draft(server, persona, who, arguments, INVALID_CONTENT, tuple(participants))
        if category == "disabled_server":
            if not self.disabled:
                return None
            server = rng.choice(self.disabled)
            persona = rng.choice(server.personas)
            trigger = rng.choice(self.triggers(server))
            arguments = {"memory_content": self.content(False), "memory_scope": "server_wide"}
            participants = self.participants(server, trigger, persona)
            return _Draft(server, persona, trigger.user.disc_id, arguments, DISABLED, tuple(participants))
        if category == "unknown_trigger":
            stranger = str(1_180_000_000_000_000_000 + rng.randrange(10**9))
            arguments = {"memory_content": self.content(False), "memory_scope": "server_wide"}
            return _Draft(server, persona, stranger, arguments, INTERNAL, tuple(participants))
        target: str | None
        expected: str
        if category == "ambiguous_name":
            target, expected = server.twin_name, AMBIGUOUS
        elif category == "unknown_name":
            target, expected = rng.choice(UNKNOWN_NAMES), NOT_FOUND
        elif category == "unknown_user":
            strangers = [
                m for m in server.members if not m.user.has_row and m.user.disc_id not in server.twins
            ]
            target, expected = (rng.choice(strangers).display_name if strangers else None), NOT_FOUND
        elif category == "privacy_restricted":
            private = [
                m
                for m in server.members
                if m.user.has_row and m.user.privacy > 0 and m.user.disc_id not in server.twins
            ]
            target, expected = (rng.choice(private).display_name if private else None), PRIVACY
        else:
            raise AssertionError(category)
        if target is None:
            return None
        arguments = {
            "memory_content": self.content(True),
            "memory_scope": "target_user",
            "target_user": target,
        }
        return _Draft(server, persona, who, arguments, expected, tuple(participants))

    def draft(self, category: str) -> list[_Draft] | None:
        if category in ("server_wide", "bridge_user", "bot_itself"):
            made = self.server_save(category)
        elif category.startswith("personal_") and category != "personal_limit":
            made = self.personal_save(category)
        elif category == "server_limit":
            made = self.server_limit()
        elif category == "personal_limit":
            made = self.personal_limit()
        elif category == "contested_limit":
            return self.contested_limit()
        else:
            made = self.failure(category)
        return None if made is None else [made]
