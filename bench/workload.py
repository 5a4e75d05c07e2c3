"""The event mix: tool-call events as plain CONTRACT.md JSON, each with the status it must end as.

The shards are TypeScript; these bodies are built as plain dicts (never through the project's models),
as a shard would write them. Every event's expected status is known up front, except in the
"contested" scopes, where several events race for the last free slots of a personal scope: there only
the split is known (``k`` saves and the rest ``limit_exceeded``), not which event wins. The workload
also decides which limit scopes start full or nearly full; the seeding writes those memories.

Normal saves never reach a limit: the generator tracks every scope's remaining room and sends normal
saves only where room is left, so "saved" is deterministic for them.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import orjson

from bench.workload_drafts import _Draft, _Generator
from bench.workload_mix import ALIAS, LIMIT_EXCEEDED, MIX, SAVED, TOOL, WorldTooSmall
from bench.world import BOT_DISC_ID, World
from worker.config import Limits

__all__ = ["SAVED", "PlannedEvent", "Workload", "WorldTooSmall", "build_workload", "by_shard"]

EPOCH = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class PlannedEvent:
    """One event as it goes on the wire, with what it must end as."""

    index: int
    event_id: str
    tool_call_id: str
    shard_id: int
    routing_key: str
    body: bytes
    traceparent: str
    category: str
    #: the status it must get; ``None`` for a contested event (only its scope's split is known)
    expected: str | None
    contested: tuple[int, int] | None = None


@dataclass
class Workload:
    """The events in publishing order and everything the checks need."""

    events: list[PlannedEvent]
    #: status -> how many events must end with it (contested scopes included)
    expected: Counter[str]
    #: memories the limit scenarios need before the run, by scope (on top of the world's background)
    server_memories: dict[tuple[int, int], int]
    personal_memories: dict[tuple[int, int], int]
    categories: Counter[str] = field(default_factory=Counter)

    @property
    def expected_notices(self) -> int:
        return self.expected[SAVED]

    def split(self, warmup: int) -> tuple[list[PlannedEvent], list[PlannedEvent]]:
        return self.events[:warmup], self.events[warmup:]


def build_workload(world: World, *, count: int, shards: int, seed: int, limits: Limits) -> Workload:
    """``count`` events over ``shards`` shards (round robin), deterministic for ``seed``."""
    rng = random.Random(f"workload:{seed}")
    generator = _Generator(world, limits, rng)
    categories = list(MIX)
    weights = [MIX[c] for c in categories]
    drafts: list[tuple[str, _Draft]] = []
    while len(drafts) < count:
        category = rng.choices(categories, weights)[0]
        made = generator.draft(category)
        if made is None:  # this world cannot stage that case (e.g. no disabled server): a plain save
            category, made = "server_wide", generator.draft("server_wide")
        assert made is not None
        drafts.extend((category, d) for d in made)
    drafts = drafts[:count]
    events = [_event(i, category, draft, shards, rng) for i, (category, draft) in enumerate(drafts)]
    expected: Counter[str] = Counter(e.expected for e in events if e.expected is not None)
    contested: Counter[tuple[int, int]] = Counter(e.contested for e in events if e.contested is not None)
    for scope, racing in contested.items():
        room = generator.contested_room[scope]
        expected[SAVED] += min(room, racing)
        expected[LIMIT_EXCEEDED] += racing - min(room, racing)
    return Workload(
        events=events,
        expected=expected,
        server_memories=generator.extra_server,
        personal_memories=generator.extra_personal,
        categories=Counter(category for category, _ in drafts),
    )


def _event(index: int, category: str, draft: _Draft, shards: int, rng: random.Random) -> PlannedEvent:
    event_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    tool_name = ALIAS if rng.random() < 0.1 else TOOL
    shard_id = index % shards
    tool_call_id = f"call_{index:07d}"
    server, persona = draft.server, draft.persona
    body = {
        "schema_version": 1,
        "event_id": event_id,
        "tool_call_id": tool_call_id,
        "tool_name": tool_name,
        "issued_at": (EPOCH + timedelta(milliseconds=index * 7)).isoformat().replace("+00:00", "Z"),
        "shard_id": shard_id,
        "arguments": draft.arguments,
        "context": {
            "guild_disc_id": server.disc_id,
            "channel_disc_id": rng.choice(server.channels),
            "thread_id": None,
            "triggering_user_disc_id": draft.trigger,
            "bot_user_disc_id": BOT_DISC_ID,
            "persona_id": persona.persona_id,
            "reply_via": persona.reply_via(),
            "participants": list(draft.participants),
            "guild_members": server.guild_members,
        },
    }
    traceparent = f"00-{rng.getrandbits(128):032x}-{rng.getrandbits(64):016x}-01"
    return PlannedEvent(
        index=index,
        event_id=event_id,
        tool_call_id=tool_call_id,
        shard_id=shard_id,
        routing_key=f"tool.{tool_name}",
        body=orjson.dumps(body),
        traceparent=traceparent,
        category=category,
        expected=draft.expected,
        contested=draft.contested,
    )


def by_shard(events: list[PlannedEvent], shards: int) -> list[list[PlannedEvent]]:
    """The events each shard publishes, in order."""
    out: list[list[PlannedEvent]] = [[] for _ in range(shards)]
    for event in events:
        out[event.shard_id].append(event)
    return out
