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


#: an operation's outcome for a letter, as the state of the letter's row
_OUTCOME_STATE = (
    "CASE l.outcome WHEN 'replayed' THEN 'replayed' WHEN 'replayed_before' THEN 'replayed'"
    " WHEN 'deleted' THEN 'purged' WHEN 'expired' THEN 'expired' END"
)

_KEEP = f"""
WITH given AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[],
                         $7::timestamptz[], $8::bigint[], $9::text[], $10::text[], $11::text[], $12::int[],
                         $13::text[]::jsonb[], $14::text[]::jsonb[], $15::bytea[], $16::int[],
                         $17::text[], $18::text[])
        AS g(letter_key, event_id, kind, error, first_error, attempts, failed_at, shard_id, guild_id,
             routing_key, message_id, replay_count, headers, properties, body, body_size, exchange,
             delivery_routing_key)
), kept AS (
    -- a letter an operation took before its copy was kept (the keepers behind) is kept in the state the
    -- operation left it in, by the operation's record of its key
    INSERT INTO {TABLE} (letter_key, event_id, kind, error, first_error, attempts, failed_at,
                         shard_id, guild_id, routing_key, message_id, replay_count, headers, properties,
                         body, body_size, exchange, delivery_routing_key, state, operation_id, state_detail)
    SELECT g.*,
           CASE WHEN taken.state = 'replayed' AND EXISTS (
                    SELECT 1 FROM {TABLE} back
                    WHERE back.event_id = g.event_id AND back.replay_count = g.replay_count + 1)
                THEN 'came_back' ELSE coalesce(taken.state, 'waiting') END,
           taken.operation_id, taken.detail
    FROM given g
    LEFT JOIN LATERAL (
        SELECT {_OUTCOME_STATE} AS state, l.operation_id,
               'kept after ' || o.action || ' by ' || o.actor || ' had taken it' AS detail
        FROM public.ltm_dlq_operation_letters l
        JOIN public.ltm_dlq_operations o ON o.operation_id = l.operation_id
        WHERE l.letter_key = g.letter_key
          AND l.outcome IN ('replayed', 'replayed_before', 'deleted', 'expired')
        ORDER BY l.recorded_at DESC
        LIMIT 1
    ) taken ON true
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
