"""``python -m bench noisy``'s cast: the tenants (a shard, from one guild of it), their rows, their
events, each shard's publishing on its connection, B's trickle, and every result as it comes back."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg
import orjson
from aio_pika.abc import AbstractIncomingMessage

from sim.shard import EVENT_TYPE, ShardLink
from worker.testing.seed import BotRows

BOT = "1150000000000000999"
AUTHOR = "1150000000000000200"
#: the guild of the first loud tenant (A, shard 0) and B's guild; the other loud tenants' guilds follow
GUILD_A, GUILD_B = "1150000000000000001", "1150000000000000002"


def loud_guild(index: int) -> str:
    """The guild of loud tenant ``index`` (0 is A's, as before there were several)."""
    return GUILD_A if index == 0 else str(int(GUILD_A) + 10 + index)


@dataclass(frozen=True)
class Tenant:
    """Who publishes: a shard, from one guild of it."""

    shard_id: int
    guild: str


@dataclass(frozen=True)
class Cast:
    """The loud tenants, B, and every shard and guild used."""

    loud: list[Tenant]
    quiet: Tenant

    @classmethod
    def of(cls, loud: int, same_shard: bool) -> Cast:
        tenants = [Tenant(i, loud_guild(i)) for i in range(loud)]
        return cls(tenants, Tenant(0 if same_shard else loud, GUILD_B))

    @property
    def shards(self) -> list[int]:
        return sorted({t.shard_id for t in (*self.loud, self.quiet)})

    @property
    def guilds(self) -> list[str]:
        return [*(t.guild for t in self.loud), self.quiet.guild]

    def warm_guild(self, shard_id: int) -> str:
        """The guild a shard's warm-up event comes from (a loud one's own, else B's)."""
        return next((t.guild for t in self.loud if t.shard_id == shard_id), self.quiet.guild)


@dataclass
class Answers:
    """Every result, by event id: when it came and how many copies."""

    arrived: dict[str, float] = field(default_factory=dict)
    copies: Counter[str] = field(default_factory=Counter)
    more: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_result(self, message: AbstractIncomingMessage) -> None:
        event_id = orjson.loads(message.body)["event_id"]
        self.arrived.setdefault(event_id, time.monotonic())
        self.copies[event_id] += 1
        self.more.set()

    async def on_notice(self, message: AbstractIncomingMessage) -> None:
        return None

    async def wait(self, ids: list[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while any(i not in self.arrived for i in ids):
            self.more.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self.more.wait(), left)
            except TimeoutError:
                return False
        return True


@dataclass
class Seeded:
    #: by guild
    personas: dict[str, int]


async def seed(dsn: str, guilds: list[str]) -> Seeded:
    """A server and a persona per guild, and the author's users row."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = BotRows(conn)
        personas = {}
        for guild in guilds:
            personas[guild], _ = await rows.persona(await rows.server(guild))
        await rows.user(AUTHOR)
        return Seeded(personas)
    finally:
        await conn.close()


def event(shard_id: int, guild: str, persona_id: int, n: int) -> tuple[str, bytes]:
    event_id = str(uuid.uuid4())
    body = {
        "schema_version": 1,
        "event_id": event_id,
        "tool_call_id": f"call_{n}",
        "tool_name": "create_long_term_memory",
        "issued_at": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "shard_id": shard_id,
        "arguments": {"memory_content": f"{{user}} knows fact number {n}", "memory_scope": "server_wide"},
        "context": {
            "guild_disc_id": guild,
            "channel_disc_id": "1150000000000000100",
            "thread_id": None,
            "triggering_user_disc_id": AUTHOR,
            "bot_user_disc_id": BOT,
            "persona_id": persona_id,
            "reply_via": None,
            "participants": [],
            "guild_members": [],
        },
    }
    return event_id, orjson.dumps(body)


class Shard:
    """One shard publishing on its own connection."""

    def __init__(self, link: ShardLink, kit_path: bool) -> None:
        self.link = link
        self.kit_path = kit_path
        self.sent: dict[str, float] = {}
        self.confirmed: dict[str, float] = {}

    @property
    def key(self) -> str:
        key = "tool.create_long_term_memory"
        if self.kit_path:
            key += f".shard.{self.link.shard_id}"
        return key

    async def send(self, event_id: str, body: bytes) -> None:
        self.sent[event_id] = time.monotonic()
        await self.link.publish(
            body, routing_key=self.key, message_id=event_id, type=EVENT_TYPE, mandatory=True
        )
        self.confirmed[event_id] = time.monotonic()


async def trickle(shard: Shard, make: Any, rate: float, until: asyncio.Event, at_least: float) -> list[str]:
    """``rate`` events a second (on schedule, open loop) until ``until`` is set and ``at_least`` seconds
    passed."""
    ids: list[str] = []
    sending: set[asyncio.Future[None]] = set()
    started = time.monotonic()
    n = 0
    while not (until.is_set() and time.monotonic() - started >= at_least):
        event_id, body = make(n)
        ids.append(event_id)
        send = asyncio.ensure_future(shard.send(event_id, body))
        sending.add(send)
        send.add_done_callback(sending.discard)
        n += 1
        await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))
    await asyncio.gather(*sending)
    return ids
