"""SQL the worker runs, in plain sight, one function per statement.

Per event: :func:`load` reads, then one writing statement (:func:`save_event` or :func:`record_outcome`)
commits everything the event writes at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
import orjson

from worker.pipeline.state import LoadedState, NamingConfig, PersonaState, ServerState, UserRecord

_LOAD = """
WITH server AS (
    SELECT s.server_id, s.server_disc_id,
           COALESCE(f.self_teaching_enabled, true) AS self_teaching_enabled,
           COALESCE(f.personal_memories_enabled, true) AS personal_memories_enabled,
           p.persona_id, p.persona_nickname, p.persona_lineage_id,
           n.prefixes, n.suffixes
    FROM servers s
    LEFT JOIN server_member_permissions_configs f ON f.server_id = s.server_id
    LEFT JOIN personas p ON p.persona_id = $3 AND p.server_id = s.server_id
    LEFT JOIN persona_naming_configs n ON n.persona_id = p.persona_id
    WHERE s.server_disc_id = $2
)
SELECT (SELECT jsonb_build_object('status', e.status, 'memory_id', e.memory_id, 'result', e.result,
                                  'notice', e.notice, 'invalidation', e.invalidation)
        FROM ltm_processed_events e WHERE e.event_id = $1) AS stored,
       server.*,
       (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                   'user_id', u.user_id,
                   'user_disc_id', u.user_disc_id,
                   'privacy_level', u.privacy_level,
                   'has_personalization', c.user_id IS NOT NULL,
                   'nickname', c.user_nickname,
                   'prefix_override', c.prefix_override,
                   'suffix_override', c.suffix_override,
                   'addressing_style', c.addressing_style,
                   'persona_nickname', np.nickname_override,
                   'persona_prefix_override', np.prefix_override,
                   'persona_suffix_override', np.suffix_override,
                   'blacklisted', b.user_disc_id IS NOT NULL)), '[]'::jsonb)
        FROM users u
        LEFT JOIN user_personalization_configs c ON c.user_id = u.user_id
        LEFT JOIN user_persona_naming_preferences np
               ON np.user_id = u.user_id AND np.persona_lineage_id = server.persona_lineage_id
        LEFT JOIN personalization_blacklist b
               ON b.server_id = server.server_id AND b.user_disc_id = u.user_disc_id
        WHERE u.user_disc_id = ANY($4::text[])) AS users
FROM (SELECT 1) AS one
LEFT JOIN server ON true
"""


@dataclass(frozen=True, slots=True)
class Loaded:
    """The first read for an event: its stored outcome if it was answered before, and the state."""

    stored: dict[str, Any] | None
    state: LoadedState


async def load(
    conn: asyncpg.Connection,
    event_id: UUID,
    server_disc_id: str | None,
    persona_id: int,
    user_disc_ids: Iterable[str],
) -> Loaded:
    """Load what the pipeline needs, in one round trip: the event's stored outcome (a redelivery is
    answered from it), the server by Discord id with its flags, the persona if it belongs to that
    server, and the known users among ``user_disc_ids`` with their naming for the persona's lineage
    and their blacklist state on the server.
    """
    row = await conn.fetchrow(_LOAD, event_id, server_disc_id, persona_id, sorted(set(user_disc_ids)))
    assert row is not None  # the FROM (SELECT 1) always yields one row
    server: ServerState | None = None
    persona: PersonaState | None = None
    if row["server_id"] is not None:
        server = ServerState(
            server_id=row["server_id"],
            server_disc_id=row["server_disc_id"],
            self_teaching_enabled=row["self_teaching_enabled"],
            personal_memories_enabled=row["personal_memories_enabled"],
        )
        if row["persona_id"] is not None:
            persona = PersonaState(
                persona_id=row["persona_id"],
                nickname=row["persona_nickname"],
                lineage_id=row["persona_lineage_id"],
                naming=NamingConfig(prefixes=_styles(row["prefixes"]), suffixes=_styles(row["suffixes"])),
            )
    users = {u["user_disc_id"]: UserRecord(**u) for u in row["users"]} if server is not None else {}
    return Loaded(row["stored"], LoadedState(server=server, persona=persona, users=users))


def _styles(raw: Any) -> dict[str, str]:
    """A JSONB map of addressing style -> string; anything else in it is ignored."""
    value = orjson.loads(raw) if isinstance(raw, str | bytes) else raw
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


async def save_event(
    conn: asyncpg.Connection,
    event_id: UUID,
    tool_call_id: str,
    tool_name: str,
    shard_id: int,
    *,
    scope: str,
    owner_id: int,
    lineage_id: int,
    persona_id: int | None,
    author_id: int | None,
    content: str,
    max_allowed: int,
    result: Mapping[str, Any],
    notice: Mapping[str, Any] | None,
    invalidation: Mapping[str, Any] | None,
    attempts: int,
    processed_at: datetime,
) -> tuple[bool, int | None, int | None]:
    """Claim the event, lock and count the scope, insert the memory and record the outcome: one statement.

    Returns ``(duplicate, memory_id, count_before)``: ``duplicate`` when the event was already recorded;
    ``memory_id`` ``None`` (not duplicate) when the scope was full. Nothing is written in either case
    (migration 0003, ``ltm_save_event``).
    """
    row = await conn.fetchrow(
        "SELECT duplicate, memory_id, current_count FROM ltm_save_event("
        "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
        event_id,
        tool_call_id,
        tool_name,
        shard_id,
        scope,
        owner_id,
        lineage_id,
        persona_id,
        author_id,
        content,
        max_allowed,
        result,
        notice,
        invalidation,
        attempts,
        processed_at,
    )
    assert row is not None
    return row["duplicate"], row["memory_id"], row["current_count"]


# --- the worker's own ledger of processed events ---------------------------------------------------


async def load_outcome(conn: asyncpg.Connection, event_id: UUID) -> asyncpg.Record | None:
    """The stored outcome of an event processed before."""
    row: asyncpg.Record | None = await conn.fetchrow(
        "SELECT status, memory_id, result, notice, invalidation, attempts, processed_at"
        " FROM ltm_processed_events WHERE event_id = $1",
        event_id,
    )
    return row


async def record_outcome(
    conn: asyncpg.Connection,
    event_id: UUID,
    tool_call_id: str,
    tool_name: str,
    shard_id: int,
    *,
    status: str,
    scope: str | None,
    result: Mapping[str, Any],
    attempts: int,
    processed_at: datetime,
) -> bool:
    """Record an outcome that saved nothing; ``False`` when the event was already recorded (a duplicate)."""
    recorded = await conn.fetchval(
        "INSERT INTO ltm_processed_events"
        " (event_id, tool_call_id, tool_name, shard_id, status, memory_scope, result, attempts, processed_at)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
        " ON CONFLICT (event_id) DO NOTHING RETURNING true",
        event_id,
        tool_call_id,
        tool_name,
        shard_id,
        status,
        scope,
        result,
        attempts,
        processed_at,
    )
    return bool(recorded)
