"""A replay or purge as an operation others can see and stop (migration 0011).

- :func:`begin` writes its row: for a replay, only when no other replay of the same DLQ runs, and for an
  expire or a repair (or anything while one of those runs) only when nothing else does (:class:`Busy` names
  the one in the way), and it closes the record of any operation of that DLQ that stopped without closing
  its own (killed, or cut off from Postgres: its heartbeat is older than the lease, or it ran on this machine
  in a process that is gone).
- :class:`Heartbeat` writes the running operation's progress every :data:`BEAT_SECONDS` and reads whether
  ``worker dlq cancel`` asked it to stop; the operation stops itself when it cannot write one for half the
  lease, so two replays of one DLQ never run at once.
- :func:`live`, :func:`ask_to_stop` and :func:`state_of` are what ``worker dlq operations`` and ``cancel``
  read and write.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

import orjson

from worker.broker.headers import rfc3339
from worker.ops.dlq.audit import Audit, AuditUnavailable, Operation
from worker.ops.dlq.record import OPERATIONS, alive
from worker.redact import describe

#: how often a running operation writes its heartbeat and progress (and learns of a cancellation)
BEAT_SECONDS = 1.0


#: the operations that run alone on their DLQ: the retention's sweep and a repair read every letter and must
#: not race a replay or purge for them (nor each other)
ALONE = frozenset({"expire", "repair"})
#: what an operation is doing, as :class:`Busy` says it
_DOING = {"replay": "replaying", "purge": "purging", "expire": "expiring letters of", "repair": "repairing"}


def in_the_way(action: str, running: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The running operation that keeps ``action`` from starting on the same DLQ, or None: one replay at a
    time, and an expire or repair runs alone."""
    for row in running:
        if action in ALONE or row["action"] in ALONE or action == row["action"] == "replay":
            return row
    return None


class Busy(Exception):
    """Another operation that must not run beside this one is running on the same DLQ (a replay beside a
    replay; anything beside an expire or repair); the message names it, who runs it and how to stop it."""

    def __init__(self, holder: Mapping[str, Any], action: str = "replay") -> None:
        moved, selected = holder["moved"] or 0, holder["selected"] or 0
        rate = "as fast as the broker confirms" if holder["rate"] is None else f"at {holder['rate']:g}/s"
        held = holder.get("action", "replay")
        doing = _DOING.get(held, "replaying")
        rule = (
            "one replay per DLQ at a time"
            if action == held == "replay"
            else "an expire or repair runs alone on its DLQ"
        )
        super().__init__(
            f"operation {holder['operation_id']} by {holder['actor']} is {doing} {holder['queue']} "
            f"since {rfc3339(holder['started_at'])} ({moved} moved of {selected} selected so far, {rate}); "
            f"{rule}: wait for it"
            + (
                f", or stop it with `worker dlq cancel {holder['operation_id']}`"
                if held == "replay"
                else " (it ends on its own)"
            )
        )
        self.operation_id = str(holder["operation_id"])


async def begin(
    audit: Audit,
    action: str,
    actor: str,
    filters: Mapping[str, Any],
    *,
    vhost: str,
    queue: str,
    rate: float | None = None,
) -> Operation:
    """Write the operation's row (``started``, its heartbeat now) and return it.

    The check for a running replay and the row are one transaction under a lock of that DLQ (a
    transaction-scoped advisory lock: it holds through PgBouncer), so two replays started at once cannot both
    pass. :class:`Busy` when an operation in the way runs (:func:`in_the_way`); :class:`AuditUnavailable`
    when Postgres fails."""
    operation = Operation(audit, uuid.uuid4(), action, actor, rate)
    try:
        async with audit.transaction() as conn:
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended('ltm dlq ' || $1 || ' ' || $2, 0))",
                vhost,
                queue,
            )
            holders = await conn.fetch(
                f"SELECT * FROM {OPERATIONS} WHERE vhost = $1 AND queue = $2 AND state = 'started'"
                f" AND {alive('heartbeat_at')} ORDER BY started_at",
                vhost,
                queue,
            )
            gone = [row["operation_id"] for row in holders if _gone(row)]
            await conn.execute(
                f"UPDATE {OPERATIONS} SET state = 'interrupted', finished_at = now(), detail = {_LOST}"
                f" WHERE vhost = $1 AND queue = $2 AND state = 'started'"
                f" AND (NOT {alive('heartbeat_at')} OR operation_id = ANY($3::uuid[]))",
                vhost,
                queue,
                gone,
            )
            running = [row for row in holders if row["operation_id"] not in gone]
            if (holder := in_the_way(action, running)) is not None:
                raise Busy(holder, action)
            await conn.execute(
                f"INSERT INTO {OPERATIONS} (operation_id, action, actor, filters, vhost, queue, rate,"
                " heartbeat_at, host, pid) VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, now(), $8, $9)",
                operation.id,
                action,
                actor,
                orjson.dumps(dict(filters)).decode(),
                vhost,
                queue,
                rate,
                socket.gethostname(),
                os.getpid(),
            )
    except (Busy, AuditUnavailable):
        raise
    except Exception as exc:
        raise AuditUnavailable(f"cannot write the audit record to Postgres: {describe(exc)}") from None
    return operation


def _gone(row: Mapping[str, Any]) -> bool:
    """Whether the operation ran on this machine in a process that no longer exists (killed: its heartbeat
    has not lapsed yet, but nothing will write it again)."""
    if row["host"] != socket.gethostname() or row["pid"] is None or row["pid"] == os.getpid():
        return False
    try:
        os.kill(row["pid"], 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists, another user's
        return False
    return False


#: SQL: what the record of an operation that stopped without closing it says
_LOST = (
    "'lost: no heartbeat since ' || to_char(coalesce(heartbeat_at, started_at) AT TIME ZONE 'UTC',"
    ' \'YYYY-MM-DD"T"HH24:MI:SS"Z"\') || \' (its process was killed or lost Postgres; letters it held went'
    " back to the DLQ, its pending ones are in doubt)'"
)


class Heartbeat:
    """While the operation runs (``async with``): its heartbeat and progress written every ``every``
    seconds, a cancellation read back (``operation.cancelled_by``), a failure kept (``operation.failure``;
    :meth:`Operation.stopping` stops the operation once it lasts half the lease)."""

    def __init__(self, operation: Operation, every: float = BEAT_SECONDS) -> None:
        self._operation = operation
        self._every = every
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Heartbeat:
        self._task = asyncio.get_running_loop().create_task(self._beat())
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self._every)
            try:
                await self._operation.beat()
            except AuditUnavailable as exc:
                self._operation.failure = str(exc)


async def live(audit: Audit) -> list[dict[str, Any]]:
    """Every operation whose record is open, oldest first: ``running`` (its heartbeat is recent) or ``lost``
    (it stopped without closing its record; the next operation on its DLQ closes it)."""
    rows = await audit.query(
        f"SELECT *, {alive('heartbeat_at')} AS alive FROM {OPERATIONS} WHERE state = 'started'"
        " ORDER BY started_at, operation_id"
    )
    return [_live_json(row) for row in rows]


async def state_of(audit: Audit, operation_id: uuid.UUID) -> dict[str, Any] | None:
    """One operation as :func:`live` gives it (``state``: its recorded state unless it is ``started``)."""
    rows = await audit.query(
        f"SELECT *, {alive('heartbeat_at')} AS alive FROM {OPERATIONS} WHERE operation_id = $1", operation_id
    )
    return _live_json(rows[0]) if rows else None


async def ask_to_stop(audit: Audit, operation_id: uuid.UUID, actor: str) -> dict[str, Any] | None:
    """Ask an open operation to stop (it reads this with its next heartbeat); an operation that was already
    lost is closed here as ``interrupted``. The operation as :func:`state_of` gives it then, or None."""
    await audit.query(
        f"UPDATE {OPERATIONS} SET cancel_requested_at = coalesce(cancel_requested_at, now()),"
        " cancelled_by = coalesce(cancelled_by, $2) WHERE operation_id = $1 AND state = 'started'",
        operation_id,
        actor,
    )
    now = await state_of(audit, operation_id)
    if now is not None and now["state"] == "lost":
        await audit.query(
            f"UPDATE {OPERATIONS} SET state = 'interrupted', finished_at = now(), detail = {_LOST}"
            " WHERE operation_id = $1 AND state = 'started'",
            operation_id,
        )
        now = await state_of(audit, operation_id)
    return now


def _time(value: datetime | None) -> str | None:
    return None if value is None else rfc3339(value)


def _live_json(row: Mapping[str, Any]) -> dict[str, Any]:
    filters = row["filters"]
    if isinstance(filters, str):
        filters = orjson.loads(filters)
    state = row["state"]
    if state == "started":
        state = "running" if row["alive"] and not _gone(row) else "lost"
    return {
        "operation_id": str(row["operation_id"]),
        "action": row["action"],
        "actor": row["actor"],
        "state": state,
        "rate": row["rate"],
        "moved": row["moved"] or 0,
        "selected": row["selected"] or 0,
        "scanned": row["scanned"] or 0,
        "expected": row["expected"] or 0,
        "started_at": _time(row["started_at"]),
        "heartbeat_at": _time(row["heartbeat_at"]),
        "finished_at": _time(row["finished_at"]),
        "cancel_requested_at": _time(row["cancel_requested_at"]),
        "cancelled_by": row["cancelled_by"],
        "detail": row["detail"],
        "filters": filters,
        "vhost": row["vhost"],
        "queue": row["queue"],
    }
