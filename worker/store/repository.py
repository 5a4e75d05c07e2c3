"""SQL the worker runs, in plain sight, one function per statement. Every call takes the connection of
the event's transaction; nothing here commits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
import orjson

from worker.pipeline.state import NamingConfig, PersonaState, ServerState, UserRecord

_LOAD_SERVER_AND_PERSONA = """
SELECT s.server_id, s.server_disc_id,
       COALESCE(f.self_teaching_enabled, true) AS self_teaching_enabled,
       COALESCE(f.personal_memories_enabled, true) AS personal_memories_enabled,
       p.persona_id, p.persona_nickname, p.persona_lineage_id,
       n.prefixes, n.suffixes
FROM servers s
LEFT JOIN server_member_permissions_configs f ON f.server_id = s.server_id
LEFT JOIN personas p ON p.persona_id = $2 AND p.server_id = s.server_id
LEFT JOIN persona_naming_configs n ON n.persona_id = p.persona_id
WHERE s.server_disc_id = $1
"""

_LOAD_USERS = """
SELECT u.user_id, u.user_disc_id, u.privacy_level,
       c.user_id IS NOT NULL AS has_personalization,
       c.user_nickname, c.prefix_override, c.suffix_override, c.addressing_style,
       np.nickname_override AS persona_nickname,
       np.prefix_override AS persona_prefix_override,
       np.suffix_override AS persona_suffix_override,
       b.user_disc_id IS NOT NULL AS blacklisted
FROM users u
LEFT JOIN user_personalization_configs c ON c.user_id = u.user_id
LEFT JOIN user_persona_naming_preferences np ON np.user_id = u.user_id AND np.persona_lineage_id = $2
LEFT JOIN personalization_blacklist b ON b.server_id = $3 AND b.user_disc_id = u.user_disc_id
WHERE u.user_disc_id = ANY($1::text[])
"""


async def load_server_and_persona(
    conn: asyncpg.Connection, server_disc_id: str, persona_id: int
) -> tuple[ServerState | None, PersonaState | None]:
    """The server by Discord id with its flags, and the persona if it belongs to that server."""
    row = await conn.fetchrow(_LOAD_SERVER_AND_PERSONA, server_disc_id, persona_id)
    if row is None:
        return None, None
    server = ServerState(
        server_id=row["server_id"],
        server_disc_id=row["server_disc_id"],
        self_teaching_enabled=row["self_teaching_enabled"],
        personal_memories_enabled=row["personal_memories_enabled"],
    )
    if row["persona_id"] is None:
        return server, None
    persona = PersonaState(
        persona_id=row["persona_id"],
        nickname=row["persona_nickname"],
        lineage_id=row["persona_lineage_id"],
        naming=NamingConfig(prefixes=_styles(row["prefixes"]), suffixes=_styles(row["suffixes"])),
    )
    return server, persona


def _styles(raw: Any) -> dict[str, str]:
    """A JSONB map of addressing style -> string; anything else in it is ignored."""
    value = orjson.loads(raw) if isinstance(raw, str | bytes) else raw
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


async def load_users(
    conn: asyncpg.Connection, disc_ids: Iterable[str], lineage_id: int | None, server_id: int | None
) -> dict[str, UserRecord]:
    """Known users among ``disc_ids`` with their naming for the lineage and blacklist on the server."""
    ids = sorted(set(disc_ids))
    if not ids:
        return {}
    rows = await conn.fetch(_LOAD_USERS, ids, lineage_id, server_id)
    return {
        row["user_disc_id"]: UserRecord(
            user_id=row["user_id"],
            user_disc_id=row["user_disc_id"],
            privacy_level=row["privacy_level"],
            has_personalization=row["has_personalization"],
            nickname=row["user_nickname"],
            prefix_override=row["prefix_override"],
            suffix_override=row["suffix_override"],
            addressing_style=row["addressing_style"],
            persona_nickname=row["persona_nickname"],
            persona_prefix_override=row["persona_prefix_override"],
            persona_suffix_override=row["persona_suffix_override"],
            blacklisted=row["blacklisted"],
        )
        for row in rows
    }


async def lock_scope(conn: asyncpg.Connection, scope: str, owner_id: int, lineage_id: int) -> None:
    """Serialise every writer of one limit scope until the transaction ends.

    The key is a hash of the scope, so an unrelated scope may rarely share a lock: that costs a wait,
    never correctness. The count that follows must be a separate statement, so that its snapshot is
    taken after the lock is held and sees every row committed by the previous holder.
    """
    await conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", f"ltm:{scope}:{owner_id}:{lineage_id}"
    )


async def count_server_memories(conn: asyncpg.Connection, server_id: int, lineage_id: int) -> int:
    count: int = await conn.fetchval(
        "SELECT count(*) FROM server_memories WHERE server_id = $1 AND persona_lineage_id = $2",
        server_id,
        lineage_id,
    )
    return count


async def count_personal_memories(conn: asyncpg.Connection, user_id: int, lineage_id: int) -> int:
    """Personal memories in the lineage plus the global lineage 0, which counts toward every persona."""
    count: int = await conn.fetchval(
        "SELECT count(*) FROM personal_memories"
        " WHERE user_id = $1 AND (persona_lineage_id = $2 OR persona_lineage_id = 0)",
        user_id,
        lineage_id,
    )
    return count


async def insert_server_memory(
    conn: asyncpg.Connection,
    server_id: int,
    persona_id: int | None,
    lineage_id: int,
    author: int | None,
    content: str,
) -> int:
    memory_id: int = await conn.fetchval(
        "INSERT INTO server_memories (server_id, persona_id, persona_lineage_id, user_id, content, tags)"
        " VALUES ($1, $2, $3, $4, $5, '{}'::text[]) RETURNING server_memory_id",
        server_id,
        persona_id,
        lineage_id,
        author,
        content,
    )
    return memory_id


async def insert_personal_memory(
    conn: asyncpg.Connection, user_id: int, lineage_id: int, content: str
) -> int:
    memory_id: int = await conn.fetchval(
        "INSERT INTO personal_memories (user_id, persona_lineage_id, content, tags)"
        " VALUES ($1, $2, $3, '{}'::text[]) RETURNING personal_memory_id",
        user_id,
        lineage_id,
        content,
    )
    return memory_id


# --- the worker's own ledger of processed events ---------------------------------------------------


async def claim_event(
    conn: asyncpg.Connection, event_id: UUID, tool_call_id: str, tool_name: str, shard_id: int
) -> bool:
    """Claim ``event_id`` for this transaction; ``False`` when it was already processed.

    A concurrent transaction holding the same claim makes this wait until it commits (then ``False``)
    or rolls back (then ``True``): the primary key is the idempotency guard.
    """
    claimed = await conn.fetchval(
        "INSERT INTO ltm_processed_events (event_id, tool_call_id, tool_name, shard_id, status)"
        " VALUES ($1, $2, $3, $4, 'processing') ON CONFLICT (event_id) DO NOTHING RETURNING true",
        event_id,
        tool_call_id,
        tool_name,
        shard_id,
    )
    return bool(claimed)


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
