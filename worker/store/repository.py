"""The SQL of the pipeline, in plain sight, one function per statement: the events' reads and writes, the
worker's ledger of processed events and the invalidation outbox. (The shards' own queues are
:mod:`worker.store.shard_queues`'s, what the workers saw of each shard :mod:`worker.store.activity`'s.)

Per batch of events (one event when the worker is not busy): :func:`load_many` reads, then one writing
statement (:func:`write_many`) commits everything the events write at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
import orjson

from contracts.models import ToolCallEvent
from worker.pipeline.state import LoadedState, NamingConfig, PersonaState, ServerState, UserRows

_LOAD = """
SELECT ev.i,
       (SELECT jsonb_build_object('status', e.status, 'memory_id', e.memory_id, 'result', e.result,
                                  'notice', e.notice, 'invalidation', e.invalidation,
                                  'digest', encode(e.event_digest, 'hex'), 'tool_call_id', e.tool_call_id,
                                  'tool_name', e.tool_name, 'shard_id', e.shard_id)
        FROM ltm_processed_events e WHERE e.event_id = ev.event_id) AS stored,
       s.server_id, s.server_disc_id,
       COALESCE(f.self_teaching_enabled, true) AS self_teaching_enabled,
       COALESCE(f.personal_memories_enabled, true) AS personal_memories_enabled,
       p.persona_id, p.persona_nickname, p.persona_lineage_id,
       n.prefixes, n.suffixes,
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
               ON np.user_id = u.user_id AND np.persona_lineage_id = p.persona_lineage_id
        LEFT JOIN personalization_blacklist b
               ON b.server_id = s.server_id AND b.user_disc_id = u.user_disc_id
        WHERE s.server_id IS NOT NULL AND u.user_disc_id = ANY(ev.user_disc_ids)) AS users
FROM jsonb_to_recordset($1::jsonb)
     AS ev(i integer, event_id uuid, server_disc_id text, persona_id integer, user_disc_ids text[])
LEFT JOIN servers s ON s.server_disc_id = ev.server_disc_id
LEFT JOIN server_member_permissions_configs f ON f.server_id = s.server_id
LEFT JOIN personas p ON p.persona_id = ev.persona_id AND p.server_id = s.server_id
LEFT JOIN persona_naming_configs n ON n.persona_id = p.persona_id
ORDER BY ev.i
"""


#: an event's stored outcome, with what identifies the event it answered: ``digest`` in hex or ``None``,
#: ``tool_call_id``, ``tool_name``, ``shard_id`` (:func:`worker.service.digest.same_event`)
Stored = dict[str, Any]


async def load_many(
    conn: asyncpg.Connection, events: Sequence[tuple[ToolCallEvent, Iterable[str]]]
) -> list[tuple[Stored | None, LoadedState]]:
    """Load what the pipeline needs for each ``(event, user_disc_ids)``, in one round trip (answers in event
    order): the event's stored outcome if its id was answered before (a redelivery is answered from it),
    and the state: the event's server by Discord id with its flags (in a DM the triggering user's, the
    original's ``memoryServerDiscId``), its persona if it belongs to that server, and the known users among
    ``user_disc_ids`` with their naming for the persona's lineage and their blacklist state on the server.
    """
    payload = [
        {
            "i": i,
            "event_id": str(event.event_id),
            "server_disc_id": event.context.guild_disc_id or event.context.triggering_user_disc_id,
            "persona_id": event.context.persona_id,
            "user_disc_ids": list(set(user_disc_ids)),  # order is irrelevant to = ANY(...)
        }
        for i, (event, user_disc_ids) in enumerate(events)
    ]
    rows = await conn.fetch(_LOAD, payload)
    assert len(rows) == len(events)  # one row per event: every join is a LEFT JOIN
    return [(row["stored"], _state(row)) for row in rows]


def _state(row: asyncpg.Record) -> LoadedState:
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
    rows = {u["user_disc_id"]: u for u in row["users"]} if server is not None else {}
    return LoadedState(server=server, persona=persona, users=UserRows(rows))


def _styles(raw: Any) -> dict[str, str]:
    """A JSONB map of addressing style -> string; anything else in it is ignored."""
    value = orjson.loads(raw) if isinstance(raw, str | bytes) else raw
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


@dataclass(frozen=True, slots=True)
class Written:
    """What writing one item did. ``duplicate``: the event id was already recorded (by a concurrent or
    earlier delivery) and nothing was written. For a save that is not a duplicate: ``memory_id`` ``None``
    when the scope was full (``current_count`` rows, nothing written), else the new memory's id."""

    duplicate: bool
    memory_id: int | None
    current_count: int | None


@dataclass(frozen=True, slots=True)
class SaveItem:
    """A save for :func:`write_many`: claim the event, lock and count the scope, insert the memory and record
    the outcome (``ltm_save_event``, migration 0004). ``result`` is the ledger's copy of the answer without
    ``data.memory_id``: the statement draws the id and writes it in."""

    event_id: UUID
    tool_call_id: str
    tool_name: str
    shard_id: int
    scope: str
    owner_id: int
    lineage_id: int
    persona_id: int | None
    author_id: int | None
    content: str
    max_allowed: int
    result: dict[str, Any]
    notice: dict[str, Any]
    invalidation: dict[str, Any]
    attempts: int
    processed_at: datetime
    #: the event's digest (:func:`worker.service.digest.event_digest`, migration 0006); ``None``: none kept
    digest: bytes | None = None


@dataclass(frozen=True, slots=True)
class RecordItem:
    """An outcome that saved nothing, for :func:`write_many`: only the event's claim and its answer."""

    event_id: UUID
    tool_call_id: str
    tool_name: str
    shard_id: int
    status: str
    scope: str | None
    result: dict[str, Any]
    attempts: int
    processed_at: datetime
    digest: bytes | None = None


def _item_json(item: SaveItem | RecordItem, i: int) -> dict[str, Any]:
    """One element of ``ltm_save_events``' argument (its keys are documented in migration 0004)."""
    common = {
        "i": i,
        "event_id": str(item.event_id),
        "tool_call_id": item.tool_call_id,
        "tool_name": item.tool_name,
        "shard_id": item.shard_id,
        "result": item.result,
        "attempts": item.attempts,
        "processed_at": item.processed_at.isoformat(),
        "digest": item.digest.hex() if item.digest is not None else None,
    }
    if isinstance(item, RecordItem):
        return {**common, "kind": "record", "status": item.status, "scope": item.scope}
    return {
        **common,
        "kind": "save",
        "scope": item.scope,
        "owner_id": item.owner_id,
        "lineage_id": item.lineage_id,
        "persona_id": item.persona_id,
        "author_id": item.author_id,
        "content": item.content,
        "max_allowed": item.max_allowed,
        "notice": item.notice,
        "invalidation": item.invalidation,
    }


async def write_many(conn: asyncpg.Connection, items: Sequence[SaveItem | RecordItem]) -> list[Written]:
    """Apply ``items`` in one statement and one transaction (``ltm_save_events``, migration 0004): all commit
    or none. Answers in item order.

    The items are applied in event id order, whatever order they come in: with every scope lock taken
    first, that order keeps concurrent batches from deadlocking on each other's claims.
    """
    order = sorted(range(len(items)), key=lambda k: items[k].event_id)
    payload = [_item_json(items[k], k) for k in order]
    rows = await conn.fetch(
        "SELECT i, duplicate, memory_id, current_count FROM ltm_save_events($1::jsonb)", payload
    )
    written: list[Written | None] = [None] * len(items)
    for row in rows:
        written[row["i"]] = Written(row["duplicate"], row["memory_id"], row["current_count"])
    assert all(w is not None for w in written)
    return written  # type: ignore[return-value]


# --- the worker's own ledger of processed events ---------------------------------------------------


async def load_outcomes(conn: asyncpg.Connection, event_ids: Iterable[UUID]) -> dict[UUID, Stored]:
    """The stored outcomes of events processed before, by event id (an event never recorded is absent), with
    what identifies the event each answered (as :func:`load_many`'s)."""
    rows = await conn.fetch(
        "SELECT event_id, status, memory_id, result, notice, invalidation, attempts, processed_at,"
        " encode(event_digest, 'hex') AS digest, tool_call_id, tool_name, shard_id"
        " FROM ltm_processed_events WHERE event_id = ANY($1::uuid[])",
        list(event_ids),
    )
    return {row["event_id"]: dict(row) for row in rows}


# -- the invalidation outbox (migration 0005) ---------------------------------------------------------------

_DEFER_INVALIDATIONS = """
UPDATE ltm_processed_events SET invalidation_pending_since = now()
WHERE event_id = ANY($1::uuid[]) AND invalidation IS NOT NULL AND invalidation_pending_since IS NULL
"""

_TAKE_PENDING_INVALIDATIONS = """
SELECT event_id, invalidation FROM ltm_processed_events
WHERE invalidation_pending_since IS NOT NULL
ORDER BY invalidation_pending_since, event_id
LIMIT $1
FOR UPDATE SKIP LOCKED
"""

_CLEAR_INVALIDATIONS = """
UPDATE ltm_processed_events SET invalidation_pending_since = NULL WHERE event_id = ANY($1::uuid[])
"""

_COUNT_PENDING_INVALIDATIONS = """
SELECT count(*) FROM ltm_processed_events WHERE invalidation_pending_since IS NOT NULL
"""


async def defer_invalidations(conn: asyncpg.Connection, event_ids: Sequence[UUID]) -> None:
    """Mark the invalidations of ``event_ids`` as not yet published (the outbox publishes them later)."""
    await conn.execute(_DEFER_INVALIDATIONS, list(event_ids))


async def take_pending_invalidations(conn: asyncpg.Connection, limit: int) -> list[tuple[UUID, Any]]:
    """The oldest pending invalidations, locked until the caller's transaction ends (other workers skip
    them). Call inside a transaction."""
    rows = await conn.fetch(_TAKE_PENDING_INVALIDATIONS, limit)
    return [(row["event_id"], row["invalidation"]) for row in rows]


async def clear_invalidations(conn: asyncpg.Connection, event_ids: Sequence[UUID]) -> None:
    """Mark the invalidations of ``event_ids`` as published."""
    await conn.execute(_CLEAR_INVALIDATIONS, list(event_ids))


async def count_pending_invalidations(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval(_COUNT_PENDING_INVALIDATIONS))
