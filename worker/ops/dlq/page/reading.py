"""What a view of the page reads: the letters waiting in the DLQ (:class:`Snapshot`), a letter in full, both
from the table the workers keep, and the audit history."""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from worker.broker.dead_letters import Letter
from worker.broker.urls import vhost_of
from worker.config import Topology
from worker.ops.dlq.audit import Audit
from worker.ops.dlq.history import Record, life, read_record, returned
from worker.ops.dlq.kept import KeptLetters
from worker.ops.dlq.reading import Seen
from worker.ops.dlq.running import ask_to_stop, live
from worker.ops.dlq.selection import Selection
from worker.ops.dlq.sweep import DEFAULT_BATCH, open_dead_letters


@dataclass
class Snapshot:
    """Every dead letter of one pass (described, not kept), and what the pass saw."""

    taken_at: datetime
    letters: list[Letter]
    scanned: int
    queue: str
    vhost: str
    seconds: float


@dataclass
class Reader:
    """What the page reads from: the broker and, for the history, Postgres."""

    url: str
    dsn: str
    topology: Topology
    batch: int = DEFAULT_BATCH
    #: LTM_TRUSTED_PUBLISHERS, by which each letter's sender is read (``worker.broker.published_by``)
    trusted: frozenset[str] = frozenset()

    async def snapshot(self, selection: Selection = Selection(), limit: int | None = None) -> Snapshot:
        """The letters waiting in the DLQ, from the table the workers keep (the broker delivers nothing; a
        passive declare checks the DLQ exists, as a read of the queue would)."""
        started = time.monotonic()
        async with (
            open_dead_letters(self.url, self.topology, trusted=self.trusted) as dlq,
            KeptLetters.opened(self.dsn, self.topology, self.trusted) as kept,
        ):
            now = datetime.now(UTC)
            letters = (await kept.waiting(selection, now))[:limit]
            return Snapshot(
                now,
                letters,
                await kept.count_waiting(),
                dlq.name,
                vhost_of(dlq.url),
                time.monotonic() - started,
            )

    async def letter(self, event_id: str) -> tuple[list[tuple[Seen, datetime]], int]:
        """Every dead letter with this event id waiting in the DLQ, as ``show`` finds them (headers and body
        kept), and how many letters wait."""
        async with KeptLetters.opened(self.dsn, self.topology, self.trusted) as kept:
            now = datetime.now(UTC)
            found = await kept.whole(event_id, waiting_only=True)
            return [(seen, now) for seen in found], await kept.count_waiting()

    async def history(
        self, limit: int, operation: str | None = None, letters: Collection[Letter] | None = None
    ) -> Record:
        """The audit record (``operation``: that one, with its letters), each replay with the letters that
        came back; ``letters``: the DLQ as a view just read it (else read here if the record cannot tell)."""
        operation_id = uuid.UUID(operation) if operation else None
        async with Audit.opened(self.dsn) as audit:
            return await read_record(
                audit,
                limit=limit,
                operation_id=operation_id,
                url=self.url,
                topology=self.topology,
                in_dlq=None if letters is None else returned(letters),
            )

    async def life(self, event_id: str) -> list[dict[str, Any]]:
        """What the audit record knows of the event (history.py ``life``)."""
        async with Audit.opened(self.dsn) as audit:
            return await life(audit, event_id)

    async def operations(self) -> list[dict[str, Any]]:
        """What runs now (running.py ``live``)."""
        async with Audit.opened(self.dsn) as audit:
            return await live(audit)

    async def cancel(self, operation_id: str, actor: str) -> dict[str, Any] | None:
        """Ask a running replay to stop (running.py ``ask_to_stop``); the operation then, or None."""
        async with Audit.opened(self.dsn) as audit:
            return await ask_to_stop(audit, uuid.UUID(operation_id), actor)
