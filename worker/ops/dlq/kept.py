"""The dead letters kept in Postgres (``ltm_dead_letters``, written by the workers' keeper), read the way
``list``, ``show`` and the page need them: queries, so the broker delivers nothing and the DLQ's
``x-delivery-count`` stays as it was.

A :class:`Selection` becomes the query's WHERE clause where it can (kind, event id, shard, guild, error
text, failure times), and is then applied whole to each row as it is to a letter taken from the queue, so
both paths select the same letters (``--group`` is applied that way only: its error groups are computed).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiormq.exceptions
import asyncpg
import orjson

from worker.aio import close_quietly
from worker.broker.dead_letters import PROPERTY_NAMES, Letter, describe_dead_letter
from worker.config import Topology
from worker.ops.dlq.audit import AuditUnavailable
from worker.ops.dlq.operations import Totals
from worker.ops.dlq.reading import Seen
from worker.ops.dlq.selection import Selection
from worker.ops.dlq.sweep import DeadLetterQueue, queue_depth
from worker.redact import describe, redact_url
from worker.store.dead_letters import TABLE
from worker.store.pool import connect_once

CONNECT_TIMEOUT = 10.0

#: what a list reads of each row: everything but the headers, properties and body
_SUMMARY = (
    "letter_key, event_id, kind, error, first_error, attempts, failed_at, shard_id, guild_id, routing_key,"
    " message_id, replay_count, kept_at, state"
)


@dataclass(frozen=True, slots=True)
class LetterState:
    """Where a kept letter is in its life (``show``, a letter's page)."""

    state: str
    kept_at: datetime
    state_at: datetime
    detail: str | None
    operation_id: str | None
    #: for a replayed letter: whether the worker answered its event since (the ledger holds it)
    answered: bool = False

    def describe(self) -> str:
        """``waiting in the DLQ (kept 2026-...)``, ``replayed and answered (...)``: one line."""
        words = {
            "waiting": "waiting in the DLQ",
            "replayed": "replayed and answered" if self.answered else "replayed, not answered yet",
            "came_back": "replayed, and came back to the DLQ",
            "purged": "purged",
            "expired": "expired (LTM_DLQ_RETENTION)",
        }.get(self.state, self.state)
        since = "" if self.state == "waiting" else f" at {_time(self.state_at)}"
        how = f": {self.detail}" if self.detail else ""
        operation = f" (operation {self.operation_id})" if self.operation_id else ""
        return f"{words}{since}{how}{operation}; kept in Postgres since {_time(self.kept_at)}"


@dataclass(frozen=True, slots=True)
class KeptLetters:
    """One connection to the kept letters."""

    conn: asyncpg.Connection
    topology: Topology
    trusted: frozenset[str] = frozenset()

    @classmethod
    @contextlib.asynccontextmanager
    async def opened(
        cls, dsn: str, topology: Topology, trusted: frozenset[str] = frozenset()
    ) -> AsyncIterator[KeptLetters]:
        """Connect and check that the table exists; :class:`AuditUnavailable` (exit 5) otherwise."""
        try:
            conn = await connect_once(dsn, timeout=CONNECT_TIMEOUT)
        except Exception as exc:
            raise AuditUnavailable(
                f"cannot reach Postgres at {redact_url(dsn)}, where the dead letters are kept: "
                f"{describe(exc)} (--from-queue reads the DLQ itself)"
            ) from None
        try:
            if not await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", TABLE):
                raise AuditUnavailable(
                    f"the kept dead letters ({TABLE}, migration 0012) do not exist in {redact_url(dsn)}: run "
                    "`worker migrate` first (--from-queue reads the DLQ itself)"
                )
            yield cls(conn, topology, trusted)
        finally:
            with contextlib.suppress(Exception):
                await conn.close(timeout=5)

    async def waiting(self, selection: Selection, now: datetime) -> list[Letter]:
        """The letters waiting in the DLQ that ``selection`` picks, in the order kept (the DLQ's)."""
        where, args = _where(selection, now)
        rows = await self.conn.fetch(
            f"SELECT {_SUMMARY} FROM {TABLE} WHERE state = 'waiting'{where} ORDER BY kept_seq",
            *args,
        )
        letters = (_letter(row) for row in rows)
        return [letter for letter in letters if selection.matches(letter, now)]

    async def browse(self, selection: Selection, on_found: Callable[[Seen, datetime], None]) -> Totals:
        """What :func:`~worker.ops.dlq.operations.browse` does over the queue, over the kept letters waiting
        in it: ``on_found`` for each selected one (its description only); scanned is how many wait."""
        now = datetime.now(UTC)
        letters = await self.waiting(selection, now)
        for letter in letters:
            on_found(Seen(letter, 0), now)
        waiting = await self.count_waiting()
        return Totals(expected=waiting, scanned=waiting, selected=len(letters))

    async def count_waiting(self) -> int:
        return int(await self.conn.fetchval(f"SELECT count(*) FROM {TABLE} WHERE state = 'waiting'"))

    async def whole(self, event_id: str, *, waiting_only: bool = False) -> list[Seen]:
        """Every kept letter with this event id (waiting ones first, then the newest), in full, each with its
        state; ``waiting_only``: those in the DLQ now."""
        only = " AND state = 'waiting'" if waiting_only else ""
        rows = await self.conn.fetch(
            f"SELECT * FROM {TABLE} WHERE event_id = $1{only} ORDER BY state <> 'waiting', "
            "CASE WHEN state = 'waiting' THEN kept_seq ELSE -kept_seq END",
            event_id,
        )
        answered = False
        if rows and _is_uuid(event_id):
            answered = bool(
                await self.conn.fetchval(
                    "SELECT EXISTS (SELECT 1 FROM public.ltm_processed_events WHERE event_id = $1::uuid)",
                    event_id,
                )
            )
        return [self._seen(row, _state(row, answered).describe()) for row in rows]

    def _seen(self, row: Mapping[str, Any], state: str) -> Seen:
        """A row as ``show`` prints a letter: described again from its headers, properties and body, so who
        published it is read by the same rule as from the queue."""
        headers = _json(row["headers"])
        properties = _json(row["properties"])
        body = bytes(row["body"])
        letter = describe_dead_letter(
            body,
            headers,
            message_id=row["message_id"],
            routing_key=row["delivery_routing_key"],
            topology=self.topology,
            user_id=properties.get("user_id"),
            trusted=self.trusted,
        )
        return Seen(
            letter,
            int(row["body_size"]),
            headers,
            [(name, properties[name]) for name in PROPERTY_NAMES if name in properties],
            row["exchange"],
            row["delivery_routing_key"],
            False,
            body,
            state,
        )


async def copies_waiting(dlq: DeadLetterQueue) -> int | None:
    """How many copies wait to be kept (a passive declare: the broker delivers nothing); None when the copies
    queue does not exist (no worker of this version has run on the vhost)."""
    channel = await dlq.connection.channel(publisher_confirms=False)
    try:
        return await queue_depth(channel, dlq.topology.dead_letter_copies_queue)
    except aiormq.exceptions.ChannelNotFoundEntity:
        return None
    finally:
        await close_quietly(channel)


def disagreement(dlq: DeadLetterQueue, copies: int | None, waiting: int) -> str | None:
    """A line saying how the DLQ (``dlq.depth`` letters ready when it was opened) differs from the ``waiting``
    letters kept, or None when they agree and no copy waits to be kept."""
    topology = dlq.topology
    if copies is None:
        return (
            f"{topology.dead_letter_copies_queue} does not exist: no worker of this version has run here, so "
            "the DLQ's letters are not kept; --from-queue reads the DLQ itself"
        )
    if dlq.depth == waiting and copies == 0:
        return None
    behind = f"; {copies} copies wait to be kept (a running worker keeps them)" if copies else ""
    return (
        f"the DLQ holds {dlq.depth} letters ready, {waiting} are kept as waiting{behind}: "
        "`worker dlq check` says which differ (a replay or purge running now moves both numbers)"
    )


def _where(selection: Selection, now: datetime) -> tuple[str, list[Any]]:
    """The part of ``selection`` Postgres can apply (the rest is applied row by row)."""
    clauses: list[str] = []
    args: list[Any] = []

    def arg(value: Any) -> str:
        args.append(value)
        return f"${len(args)}"

    if selection.kinds:
        clauses.append(f"kind = ANY({arg(sorted(selection.kinds))}::text[])")
    if selection.event_ids:
        clauses.append(f"event_id = ANY({arg(sorted(selection.event_ids))}::text[])")
    if selection.shards:
        clauses.append(f"shard_id = ANY({arg(sorted(selection.shards))}::bigint[])")
    if selection.guilds:
        clauses.append(f"guild_id = ANY({arg(sorted(selection.guilds))}::text[])")
    if selection.error is not None:
        pattern = arg("%" + _like_escaped(selection.error) + "%")
        clauses.append(f"(error ILIKE {pattern} OR first_error ILIKE {pattern})")
    if selection.since is not None:
        clauses.append(f"failed_at >= {arg(selection.since)}")
    if selection.until is not None:
        clauses.append(f"failed_at < {arg(selection.until)}")
    if selection.older_than is not None:
        clauses.append(f"failed_at <= {arg(now - selection.older_than)}")
    return "".join(f" AND {clause}" for clause in clauses), args


def _like_escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _letter(row: Mapping[str, Any]) -> Letter:
    return Letter(
        event_id=row["event_id"],
        kind=row["kind"],
        error=row["error"],
        attempts=row["attempts"],
        failed_at=row["failed_at"],
        shard_id=row["shard_id"],
        routing_key=row["routing_key"],
        message_id=row["message_id"],
        replay_count=row["replay_count"],
        first_error=row["first_error"],
        guild_id=row["guild_id"],
    )


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _state(row: Mapping[str, Any], answered: bool) -> LetterState:
    operation = row["operation_id"]
    return LetterState(
        row["state"],
        row["kept_at"],
        row["state_at"],
        row["state_detail"],
        None if operation is None else str(operation),
        answered,
    )


def _json(value: Any) -> dict[str, Any]:
    """A JSONB column as a dict, whether or not the connection decodes JSON itself."""
    decoded = orjson.loads(value) if isinstance(value, str | bytes) else value
    return decoded if isinstance(decoded, dict) else {}


def _time(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
