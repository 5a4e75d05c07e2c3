"""The audit trail of ``worker dlq replay`` and ``purge`` in Postgres (migration 0007): who did what to which
dead letters, and how each one ended.

The operation's row is written before anything is taken off the queue; each dead letter's row is written
(``pending``) before it is republished or deleted, and settled (``replayed``, ``not_replayed``, ``deleted``)
once the broker confirmed that. A write that fails stops the operation before the next letter is touched, so
the record is never missing a letter that left the queue; an operation cut short stays ``started``, and its
``pending`` letters are the ones in doubt.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import socket
import time
import uuid
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg
import orjson

from worker.broker.headers import rfc3339
from worker.ops.dlq.doubt import pending_elsewhere, sent_before
from worker.ops.dlq.record import (
    LEASE_SECONDS,
    LETTERS,
    OPERATIONS,
    STATE_OF,
    came_back,
    pairs,
    replayed,
    settle_sql,
    state_detail,
    taken_again,
    twice,
)
from worker.redact import describe
from worker.redact import redact_url as redact
from worker.store.pool import connect_once

CONNECT_TIMEOUT = 10.0
#: rows written per statement
CHUNK = 1000


class AuditUnavailable(Exception):
    """The audit record cannot be written; the message says why (the operation must not run)."""


def default_actor() -> str:
    """``user@host`` of the process: who ran it, when ``--by`` does not say."""
    try:
        user = getpass.getuser()
    except Exception:  # no name for this uid (a container's numeric user)
        user = "uid-unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True, slots=True)
class Taken:
    """A dead letter an operation is about to republish or delete, known by its delivery tag."""

    tag: int
    event_id: str | None
    kind: str
    #: its ``x-ltm-replay-count`` (0: never replayed); a replayed copy carries one more
    replay_count: int = 0
    #: its row's key in ``ltm_dead_letters`` (dead_letters.py ``letter_key``): the outcome sets its state
    key: str = ""


class Audit:
    """One connection to the audit tables."""

    def __init__(self, conn: asyncpg.Connection, dsn: str) -> None:
        self._conn = conn
        self.dsn = dsn
        #: one statement at a time on the connection: the heartbeat writes beside the letters' rows
        self._turn = asyncio.Lock()

    @classmethod
    async def open(cls, dsn: str) -> Audit:
        """Connect and check that migrations 0007 to 0012 are applied; :class:`AuditUnavailable` otherwise."""
        try:
            conn = await connect_once(dsn, timeout=CONNECT_TIMEOUT)
        except Exception as exc:
            raise AuditUnavailable(f"cannot reach Postgres at {redact(dsn)}: {describe(exc)}") from None
        try:
            exists = await conn.fetchval(
                "SELECT to_regclass($1) IS NOT NULL AND EXISTS (SELECT 1 FROM pg_attribute"
                " WHERE attrelid = to_regclass($2) AND attname = 'replay_count' AND NOT attisdropped)"
                " AND EXISTS (SELECT 1 FROM pg_attribute"
                " WHERE attrelid = to_regclass($1) AND attname = 'heartbeat_at' AND NOT attisdropped)"
                " AND EXISTS (SELECT 1 FROM pg_attribute"
                " WHERE attrelid = to_regclass($2) AND attname = 'letter_key' AND NOT attisdropped)",
                OPERATIONS,
                LETTERS,
            )
        except Exception as exc:
            await conn.close()
            raise AuditUnavailable(f"cannot read Postgres at {redact(dsn)}: {describe(exc)}") from None
        if not exists:
            await conn.close()
            raise AuditUnavailable(
                f"the audit tables ({OPERATIONS}, migrations 0007, 0008, 0011 and 0012) do not exist in "
                f"{redact(dsn)}: run `worker migrate` first"
            )
        return cls(conn, dsn)

    @classmethod
    @contextlib.asynccontextmanager
    async def opened(cls, dsn: str) -> AsyncIterator[Audit]:
        """``async with Audit.opened(dsn) as audit``: :meth:`open`, then closed however the block ends."""
        audit = await cls.open(dsn)
        try:
            yield audit
        finally:
            await audit.close()

    async def close(self) -> None:
        try:
            await self._conn.close(timeout=5)
        except Exception:
            self._conn.terminate()

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[asyncpg.Connection]:
        """The connection, in a transaction and to itself (the heartbeat waits)."""
        async with self._turn, self._conn.transaction():
            yield self._conn

    async def _write(self, sql: str, *args: Any) -> None:
        await self.query(sql, *args)

    async def query(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        """Run a statement of the record; :class:`AuditUnavailable` when it fails."""
        try:
            async with self._turn:
                return list(await self._conn.fetch(sql, *args))
        except Exception as exc:
            raise AuditUnavailable(
                f"cannot write the audit record to Postgres at {redact(self.dsn)}: {describe(exc)}"
            ) from None

    async def history(
        self,
        *,
        limit: int = 50,
        operation_id: uuid.UUID | None = None,
        in_dlq: Collection[tuple[str, int]] = (),
    ) -> list[dict[str, Any]]:
        """The latest operations, newest first, with their letters counted by outcome and how many of the
        letters they replayed came back (``in_dlq``: the (event id, replay count) of the letters in the DLQ
        now, besides what later operations recorded)."""
        events, counts = pairs(in_dlq)
        rows = await self._conn.fetch(
            f"""
            SELECT o.*, coalesce(l.outcomes, '{{}}'::jsonb) AS outcomes, back.n AS came_back, twice.n AS twice
            FROM {OPERATIONS} o
            LEFT JOIN LATERAL (
                SELECT jsonb_object_agg(outcome, n) AS outcomes
                FROM (SELECT outcome, count(*) AS n FROM {LETTERS} WHERE operation_id = o.operation_id
                      GROUP BY outcome) c
            ) l ON true
            CROSS JOIN LATERAL (
                SELECT count(*) AS n FROM {LETTERS} r
                WHERE r.operation_id = o.operation_id AND {came_back("r", "$3", "$4")}
            ) back
            CROSS JOIN LATERAL (
                SELECT count(*) AS n FROM {LETTERS} r
                WHERE r.operation_id = o.operation_id AND {twice("r", "$3", "$4")}
            ) twice
            WHERE $2::uuid IS NULL OR o.operation_id = $2
            ORDER BY o.started_at DESC, o.operation_id
            LIMIT $1
            """,
            limit,
            operation_id,
            events,
            counts,
        )
        return [_operation_json(row) for row in rows]

    async def undecided(self, *, limit: int = 50, operation_id: uuid.UUID | None = None) -> bool:
        """Whether a letter these operations replayed may have come back without a later operation having
        recorded it, or one they left in doubt may be in the DLQ twice: only the DLQ can tell."""
        return bool(
            await self._conn.fetchval(
                f"""
                SELECT EXISTS (
                    SELECT 1 FROM (
                        SELECT operation_id FROM {OPERATIONS} WHERE $2::uuid IS NULL OR operation_id = $2
                        ORDER BY started_at DESC, operation_id LIMIT $1
                    ) o JOIN {LETTERS} r USING (operation_id)
                    WHERE ({replayed("r")} AND NOT {taken_again("r")}) OR r.outcome = 'pending'
                )
                """,
                limit,
                operation_id,
            )
        )

    async def letters(
        self, operation_id: uuid.UUID, in_dlq: Collection[tuple[str, int]] = ()
    ) -> list[dict[str, Any]]:
        """The letters of one operation, in order; ``came_back``: a replayed one came back to the DLQ."""
        events, counts = pairs(in_dlq)
        rows = await self._conn.fetch(
            f"SELECT position, event_id, kind, outcome, detail, recorded_at, replay_count,"
            f" {came_back('r', '$2', '$3')} AS came_back, {twice('r', '$2', '$3')} AS twice"
            f" FROM {LETTERS} r WHERE operation_id = $1"
            " ORDER BY position",
            operation_id,
            events,
            counts,
        )
        return [
            {
                "position": row["position"],
                "event_id": row["event_id"],
                "kind": row["kind"],
                "outcome": row["outcome"],
                "detail": row["detail"],
                "recorded_at": _time(row["recorded_at"]),
                "replay_count": row["replay_count"],
                "came_back": row["came_back"],
                "twice": row["twice"],
            }
            for row in rows
        ]


@dataclass
class Operation:
    """A replay or purge being recorded: its letters as they are taken and settled."""

    audit: Audit
    id: uuid.UUID
    action: str
    #: who runs it, and at what rate (None: as fast as the broker confirms), as the kept letters' state says
    actor: str = ""
    rate: float | None = None
    #: delivery tag -> the letter's position in the operation
    _positions: dict[int, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    #: how far it got, as the next heartbeat writes it: (in the DLQ at the start, scanned, selected, moved)
    counts: tuple[int, int, int, int] = (0, 0, 0, 0)
    #: who asked it to stop (``worker dlq cancel``), once a heartbeat has read it
    cancelled_by: str | None = None

    #: the (event id, replay count) of the letters in the DLQ before the pass, read when an earlier replay
    #: left letters in doubt (:mod:`worker.ops.dlq.doubt`)
    in_dlq: frozenset[tuple[str, int]] = frozenset()

    #: why the heartbeat could not be written (the operation must stop), and when it last was (monotonic)
    failure: str | None = None
    beaten_at: float = field(default_factory=time.monotonic)

    def stopping(self) -> str | None:
        """Who asked the operation to stop, or None; :class:`AuditUnavailable` when its heartbeat failed for
        long enough that others may take it as lost (then it must not touch another letter)."""
        if self.failure is not None and time.monotonic() - self.beaten_at > LEASE_SECONDS / 2:
            raise AuditUnavailable(self.failure)
        return self.cancelled_by

    def note(self, expected: int, scanned: int, selected: int, moved: int) -> None:
        """How far the operation got; the next heartbeat writes it."""
        self.counts = (expected, scanned, selected, moved)

    async def beat(self) -> None:
        """Write the heartbeat and the progress; read whether someone asked the operation to stop."""
        expected, scanned, selected, moved = self.counts
        rows = await self.audit.query(
            f"UPDATE {OPERATIONS} SET heartbeat_at = now(), expected = $2, scanned = $3, selected = $4,"
            " moved = $5 WHERE operation_id = $1 RETURNING cancelled_by, cancel_requested_at",
            self.id,
            expected,
            scanned,
            selected,
            moved,
        )
        self.beaten_at, self.failure = time.monotonic(), None
        if rows and rows[0]["cancel_requested_at"] is not None:
            self.cancelled_by = rows[0]["cancelled_by"] or "someone"

    async def in_doubt_elsewhere(self) -> bool:
        """Whether an earlier replay that no longer runs left letters in doubt (``pending``)."""
        return await pending_elsewhere(self.audit.query, self.id)

    async def sent_before(self, letters: Sequence[Taken]) -> dict[int, str]:
        """The letters an earlier replay already sent, by delivery tag, with how that is known."""
        return await sent_before(self.audit.query, self.id, letters, self.in_dlq)

    async def taking(self, letters: Sequence[Taken]) -> None:
        """Record ``letters`` as ``pending`` before they are republished or deleted."""
        for start in range(0, len(letters), CHUNK):
            chunk = letters[start : start + CHUNK]
            positions = []
            for letter in chunk:
                position = self._positions[letter.tag] = len(self._positions) + 1
                positions.append(position)
            await self.audit._write(
                f"INSERT INTO {LETTERS} (operation_id, position, event_id, kind, replay_count, letter_key)"
                " SELECT $1, p, e, k, r, nullif(lk, '')"
                " FROM unnest($2::int[], $3::text[], $4::text[], $5::int[], $6::text[]) AS t(p, e, k, r, lk)",
                self.id,
                positions,
                [letter.event_id for letter in chunk],
                [letter.kind for letter in chunk],
                [letter.replay_count for letter in chunk],
                [letter.key for letter in chunk],
            )
            self.outcomes["pending"] = self.outcomes.get("pending", 0) + len(chunk)

    async def settled(
        self, letters: Sequence[Taken], outcome: str, details: Mapping[int, str] | None = None
    ) -> None:
        """Record how ``letters`` (taken before) ended, ``details`` by delivery tag (why one failed), and in
        the same statement the state of their kept rows (record.py ``settle_sql``)."""
        state = STATE_OF.get(outcome)
        for start in range(0, len(letters), CHUNK):
            chunk = letters[start : start + CHUNK]
            await self.audit._write(
                settle_sql(),
                self.id,
                outcome,
                [self._positions[letter.tag] for letter in chunk],
                [(details or {}).get(letter.tag) for letter in chunk],
                state,
                None if state is None else state_detail(outcome, self.actor, self.rate),
            )
            self.outcomes["pending"] -= len(chunk)
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + len(chunk)

    async def finish(
        self,
        state: str,
        detail: str | None = None,
        *,
        expected: int | None = None,
        scanned: int | None = None,
    ) -> None:
        _, _, selected, moved = self.counts
        await self.audit._write(
            f"UPDATE {OPERATIONS} SET state = $2, detail = $3, finished_at = now(), expected = $4,"
            " scanned = $5, selected = $6, moved = $7 WHERE operation_id = $1",
            self.id,
            state,
            detail,
            expected,
            scanned,
            selected,
            moved,
        )


def _time(value: datetime | None) -> str | None:
    return None if value is None else rfc3339(value)


def _operation_json(row: Mapping[str, Any]) -> dict[str, Any]:
    outcomes = row["outcomes"]
    if isinstance(outcomes, str):
        outcomes = orjson.loads(outcomes)
    filters = row["filters"]
    if isinstance(filters, str):
        filters = orjson.loads(filters)
    return {
        "operation_id": str(row["operation_id"]),
        "action": row["action"],
        "actor": row["actor"],
        "rate": row["rate"],
        "started_at": _time(row["started_at"]),
        "finished_at": _time(row["finished_at"]),
        "state": row["state"],
        "detail": row["detail"],
        "filters": filters,
        "vhost": row["vhost"],
        "queue": row["queue"],
        "expected": row["expected"],
        "scanned": row["scanned"],
        "letters": dict(sorted(outcomes.items())),
        "came_back": row["came_back"],
        "twice": row["twice"],
    }
