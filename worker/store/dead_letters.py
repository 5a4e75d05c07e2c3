"""The kept dead letters (``ltm_dead_letters``, migration 0012): what a worker writes as it drains the copies
queue, one row per letter whatever how often its copy is delivered.

A letter whose replay failed again arrives as a letter of its own (its replay count one higher); the letter it
was replayed from is then marked ``came_back`` in the same statement, so the table says which replays came
back without any reader having to pair them up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg
import orjson

TABLE = "public.ltm_dead_letters"

#: the states a kept letter can be in (the table's CHECK), and how ``worker dlq`` names them
STATES = ("waiting", "replayed", "came_back", "purged", "expired")


@dataclass(frozen=True, slots=True)
class KeptLetter:
    """One row of ``ltm_dead_letters`` as the keeper writes it."""

    letter_key: str
    event_id: str | None
    kind: str
    error: str
    first_error: str
    attempts: int | None
    failed_at: datetime | None
    shard_id: int | None
    guild_id: str | None
    routing_key: str
    message_id: str | None
    replay_count: int
    #: JSON-ready (worker.broker.dead_letters ``json_safe``)
    headers: dict[str, object]
    properties: dict[str, object]
    body: bytes
    body_size: int
    #: the delivery's exchange and routing key (``tomori.dead_letter``, the key it was dead-lettered with)
    exchange: str = ""
    delivery_routing_key: str = ""


_KEEP = f"""
WITH kept AS (
    INSERT INTO {TABLE} (letter_key, event_id, kind, error, first_error, attempts, failed_at,
                         shard_id, guild_id, routing_key, message_id, replay_count, headers, properties,
                         body, body_size, exchange, delivery_routing_key)
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[],
                         $7::timestamptz[], $8::bigint[], $9::text[], $10::text[], $11::text[], $12::int[],
                         $13::text[]::jsonb[], $14::text[]::jsonb[], $15::bytea[], $16::int[],
                         $17::text[], $18::text[])
    ON CONFLICT (letter_key) DO NOTHING
    RETURNING letter_key, event_id, replay_count
)
UPDATE {TABLE} d
SET state = 'came_back', state_at = now(),
    state_detail = 'its replay failed again: the letter with replay count ' || kept.replay_count
FROM kept
WHERE kept.replay_count > 0 AND d.event_id = kept.event_id AND d.replay_count = kept.replay_count - 1
  AND d.state = 'replayed'
RETURNING kept.letter_key
"""


async def keep(conn: asyncpg.Connection | asyncpg.Pool, letters: Sequence[KeptLetter]) -> None:
    """Write ``letters`` (a letter kept before is left as it is) and mark the letters whose replay they are
    as come back, in one statement."""
    if not letters:
        return
    await conn.execute(
        _KEEP,
        [letter.letter_key for letter in letters],
        [letter.event_id for letter in letters],
        [letter.kind for letter in letters],
        [letter.error for letter in letters],
        [letter.first_error for letter in letters],
        [letter.attempts for letter in letters],
        [letter.failed_at for letter in letters],
        [letter.shard_id for letter in letters],
        [letter.guild_id for letter in letters],
        [letter.routing_key for letter in letters],
        [letter.message_id for letter in letters],
        [letter.replay_count for letter in letters],
        [orjson.dumps(letter.headers).decode() for letter in letters],
        [orjson.dumps(letter.properties).decode() for letter in letters],
        [letter.body for letter in letters],
        [letter.body_size for letter in letters],
        [letter.exchange for letter in letters],
        [letter.delivery_routing_key for letter in letters],
    )
