"""SQL the worker runs, in plain sight, one function per statement. Every call takes the connection of
the event's transaction; nothing here commits.
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

_CLAIM_AND_LOAD = """
WITH claim AS (
    INSERT INTO ltm_processed_events (event_id, tool_call_id, tool_name, shard_id, status)
    VALUES ($1, $2, $3, $4, 'processing')
    ON CONFLICT (event_id) DO NOTHING
    RETURNING event_id
), server AS (
    SELECT s.server_id, s.server_disc_id,
           COALESCE(f.self_teaching_enabled, true) AS self_teaching_enabled,
           COALESCE(f.personal_memories_enabled, true) AS personal_memories_enabled,
           p.persona_id, p.persona_nickname, p.persona_lineage_id,
           n.prefixes, n.suffixes
    FROM servers s
    LEFT JOIN server_member_permissions_configs f ON f.server_id = s.server_id
    LEFT JOIN personas p ON p.persona_id = $6 AND p.server_id = s.server_id
    LEFT JOIN persona_naming_configs n ON n.persona_id = p.persona_id
    WHERE s.server_disc_id = $5
)
SELECT EXISTS (SELECT 1 FROM claim) AS claimed, server.*,
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
        WHERE u.user_disc_id = ANY($7::text[])) AS users
FROM (SELECT 1) AS one
LEFT JOIN server ON true
"""


@dataclass(frozen=True, slots=True)
class Claimed:
    """The first read of an event's transaction: whether it is ours to process, and the state."""

    claimed: bool
    state: LoadedState


async def claim_and_load(
    conn: asyncpg.Connection,
    event_id: UUID,
    tool_call_id: str,
    tool_name: str,
    shard_id: int,
    server_disc_id: str | None,
    persona_id: int,
    user_disc_ids: Iterable[str],
) -> Claimed:
    """Claim ``event_id`` and load what the pipeline needs, in one round trip.

    The claim is the idempotency guard: a concurrent transaction holding the same event id makes the
    insert wait until it commits (then ``claimed`` is false) or rolls back (then it is ours). Loaded:
    the server by Discord id with its flags, the persona if it belongs to that server, and the known
    users among ``user_disc_ids`` with their naming for the persona's lineage and their blacklist state.
    """
    row = await conn.fetchrow(
        _CLAIM_AND_LOAD,
        event_id,
        tool_call_id,
        tool_name,
        shard_id,
        server_disc_id,
        persona_id,
        sorted(set(user_disc_ids)),
    )
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
    return Claimed(bool(row["claimed"]), LoadedState(server=server, persona=persona, users=users))


def _styles(raw: Any) -> dict[str, str]:
    """A JSONB map of addressing style -> string; anything else in it is ignored."""
    value = orjson.loads(raw) if isinstance(raw, str | bytes) else raw
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


async def save_memory(
    conn: asyncpg.Connection,
    event_id: UUID,
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
) -> tuple[int | None, int]:
    """Lock the scope, count it, and insert + record the outcome when there is room.

    Returns ``(memory_id, count_before)``; ``memory_id`` is ``None`` when the scope was full, in which
    case nothing was written (see migration 0003, ``ltm_save_memory``).
    """
    row = await conn.fetchrow(
        "SELECT memory_id, current_count"
        " FROM ltm_save_memory($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
        event_id,
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
    return row["memory_id"], row["current_count"]


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
    *,
    status: str,
    scope: str | None,
    memory_id: int | None,
    result: Mapping[str, Any],
    notice: Mapping[str, Any] | None,
    invalidation: Mapping[str, Any] | None,
    attempts: int,
    processed_at: datetime,
) -> None:
    await conn.execute(
        "UPDATE ltm_processed_events SET status = $2, memory_scope = $3, memory_id = $4, result = $5,"
        " notice = $6, invalidation = $7, attempts = $8, processed_at = $9 WHERE event_id = $1",
        event_id,
        status,
        scope,
        memory_id,
        result,
        notice,
        invalidation,
        attempts,
        processed_at,
    )
