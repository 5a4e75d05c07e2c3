"""``python -m bench memory``'s events: valid bodies of an exact size, their bytes spread over
participants' aliases (as few participants as aliases of 253 characters need, or as many as asked), and
the small warm-up event."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from bench.flood import BOT, CHANNEL, GUILD, TRIGGER
from contracts.models import MAX_ALIASES, MAX_LABEL, MAX_PARTICIPANTS
from worker.config import Topology

TOPOLOGY = Topology()
SHARD = 0
#: the author of the events: bench.flood's triggering user (its seed makes the guild's and the user's rows)
AUTHOR = TRIGGER
#: an alias as long as the review's (a label may be 256 characters)
ALIAS_CHARS = 253
#: the contract's cap on a participant's aliases
ALIASES_PER_PARTICIPANT = MAX_ALIASES
#: the part of ``tool_call_id`` (255 bytes at most) that may pad a body to its exact size
TOOL_CALL_PAD_MAX = 240


def _participants(aliases: int, last_alias: int = ALIAS_CHARS) -> list[dict[str, Any]]:
    """``aliases`` aliases of ``ALIAS_CHARS`` characters spread 32 a participant, the last one
    ``last_alias`` characters long."""
    people: list[dict[str, Any]] = []
    for n in range(aliases):
        if n % ALIASES_PER_PARTICIPANT == 0:
            i = len(people)
            people.append(
                {
                    "target_id": f"{1150000000000001000 + i}",
                    "display_label": f"Participant {i}",
                    "aliases": [],
                }
            )
        size = last_alias if n == aliases - 1 else ALIAS_CHARS
        letter = chr(ord("a") + n % 26)
        people[-1]["aliases"].append((f"{n:05d}" + letter * ALIAS_CHARS)[:size])
    return people


@dataclass(frozen=True)
class EventShape:
    """How every event of the run is built: the same participants, a ``tool_call_id`` padded so that each
    body is ``body_bytes`` long exactly (a UUID, a fixed-width count and a fixed-width time vary)."""

    persona_id: int
    content: str
    participants: list[dict[str, Any]]
    pad: int

    def event(self, n: int) -> tuple[str, bytes]:
        event_id = str(uuid.uuid4())
        body = {
            "schema_version": 1,
            "event_id": event_id,
            "tool_call_id": f"call_{n:08d}" + "p" * self.pad,
            "tool_name": "create_long_term_memory",
            "issued_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
            "shard_id": SHARD,
            "arguments": {"memory_content": self.content, "memory_scope": "server_wide"},
            "context": {
                "guild_disc_id": GUILD,
                "channel_disc_id": CHANNEL,
                "thread_id": None,
                "triggering_user_disc_id": AUTHOR,
                "bot_user_disc_id": BOT,
                "persona_id": self.persona_id,
                "reply_via": None,
                "participants": self.participants,
                "guild_members": [],
            },
        }
        return event_id, orjson.dumps(body)


def spread_shape(body_bytes: int, persona_id: int, content: str, participants: int) -> EventShape:
    """``participants`` participants of 32 aliases each, the aliases' lengths evened out so that every body
    is ``body_bytes`` long (the review's shape: many participants, aliases as long as they need to be)."""
    count = participants * ALIASES_PER_PARTICIPANT

    def people(extra: int) -> list[dict[str, Any]]:
        each, more = divmod(extra, count)
        made = _participants(count)
        n = 0
        for person in made:
            person["aliases"] = [
                (f"{(n := n + 1):05d}" + "x" * MAX_LABEL)[: 1 + each + (1 if n <= more else 0)]
                for _ in person["aliases"]
            ]
        return made

    bare = len(EventShape(persona_id, content, people(0), 0).event(0)[1])
    if bare > body_bytes:
        raise ValueError(f"--body-bytes {body_bytes} is less than {participants} participants take ({bare})")
    shape = EventShape(persona_id, content, people(body_bytes - bare), 0)
    if max(len(a) for p in shape.participants for a in p["aliases"]) > MAX_LABEL:
        raise ValueError(
            f"--participants {participants} cannot fill {body_bytes} B with aliases of {MAX_LABEL}"
        )
    assert len(shape.event(0)[1]) == body_bytes, "the body's size does not add up"
    return shape


def shape_for(body_bytes: int, persona_id: int, content: str) -> EventShape:
    """The participants and padding that make every body ``body_bytes`` long: as few participants as aliases
    of 253 characters need."""

    def size(aliases: int, last: int = ALIAS_CHARS, pad: int = 0) -> int:
        return len(EventShape(persona_id, content, _participants(aliases, last), pad).event(0)[1])

    most = ALIASES_PER_PARTICIPANT * MAX_PARTICIPANTS
    if size(0) > body_bytes:
        raise ValueError(f"--body-bytes {body_bytes} is less than an event without participants ({size(0)})")
    if size(most) < body_bytes:
        raise ValueError(f"--body-bytes {body_bytes} is more than the contract lets participants fill")
    low, high = 0, most  # size(low) <= body_bytes < size(high), or high fits exactly
    while high - low > 1:
        middle = (low + high) // 2
        if size(middle) <= body_bytes:
            low = middle
        else:
            high = middle
    short = body_bytes - size(low)
    if short <= TOOL_CALL_PAD_MAX:
        return EventShape(persona_id, content, _participants(low), short)
    # one more alias, shortened to fit (it costs more than TOOL_CALL_PAD_MAX, its text at most 253 of that)
    over = size(high) - body_bytes
    shape = EventShape(persona_id, content, _participants(high, ALIAS_CHARS - over), 0)
    assert len(shape.event(0)[1]) == body_bytes, "the body's size does not add up"
    return shape


def small_event(persona_id: int) -> tuple[str, bytes]:
    """The warm-up: one ordinary event, no participants."""
    return EventShape(persona_id, "", [], 0).event(99_999_999)
