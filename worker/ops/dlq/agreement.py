"""``worker dlq check`` and ``worker dlq repair``: whether the DLQ and the kept letters (``ltm_dead_letters``)
agree, and making them agree.

They agree when every letter in the DLQ has its row, ``waiting``, and every ``waiting`` row its letter in
the DLQ. One read pass over the DLQ (each letter put back, in order, as ``list`` reads it) keys every letter
as the keeper keys its copy (``worker.broker.dead_letters.letter_key``) and compares with the table's rows:

- **in the DLQ, not kept**: its copy never reached the table (dead-lettered before the copies queue existed,
  the copies queue purged, or the keeper behind: the copies still waiting are counted and said);
- **in the DLQ, kept as another state**: an operation recorded it replayed, purged or expired, and the letter
  is there all the same (a removal the broker lost);
- **kept as waiting, gone from the DLQ**: the letter left the DLQ outside the worker's tools (a queue purged
  in RabbitMQ's UI, another client that took it).

``repair`` (an operation on record, action ``repair``, which runs alone on its DLQ) keeps the first, sets the
second back to ``waiting`` and marks the third ``purged``, each with a line saying so. A pass that saw fewer
letters than the DLQ held (another client held some meanwhile) marks nothing as gone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from aio_pika.abc import AbstractIncomingMessage

from worker.broker.dead_letters import Letter, letter_key
from worker.config import Topology
from worker.ops.dlq.audit import Audit, AuditUnavailable, Operation
from worker.ops.dlq.audited import Audited, Ending
from worker.ops.dlq.console import EXIT_FAILED, EXIT_OK, Console, guarded, unavailable
from worker.ops.dlq.kept import copies_waiting
from worker.ops.dlq.operations import Totals
from worker.ops.dlq.reading import MAX_PREFETCH, Reading, Seen
from worker.ops.dlq.record import KEPT, LETTERS, OPERATIONS
from worker.ops.dlq.render import terminal_safe
from worker.ops.dlq.running import live
from worker.ops.dlq.selection import Selection
from worker.ops.dlq.sweep import DEFAULT_BATCH, DeadLetterQueue, Sweep, open_dead_letters
from worker.runtime.keeper import kept_letter
from worker.store.dead_letters import KeptLetter, keep

#: the event ids a text report lists per kind of disagreement (``--json`` lists them all)
SHOWN = 20


@dataclass(frozen=True, slots=True)
class Keyed(Seen):
    """What the pass keeps of a letter: what ``list`` keeps, its key, and its row to be when it has none."""

    key: str = ""
    row: KeptLetter | None = None


@dataclass
class Comparison:
    """What one pass over the DLQ found against the table."""

    dlq: str
    #: letters in the DLQ when the pass began, and how many it saw
    expected: int = 0
    scanned: int = 0
    waiting: int = 0
    #: in the DLQ with no row (their rows to be)
    not_kept: list[KeptLetter] = field(default_factory=list)
    #: in the DLQ, their rows in another state: (key, event id, state)
    not_waiting: list[tuple[str, str | None, str]] = field(default_factory=list)
    #: rows waiting whose letter is not in the DLQ: (key, event id)
    gone: list[tuple[str, str | None]] = field(default_factory=list)
    #: copies the keepers have not kept yet (None: there is no copies queue)
    copies: int | None = None
    #: the operations running on the DLQ now (their letters move as the pass reads)
    running: list[dict[str, Any]] = field(default_factory=list)

    @property
    def agree(self) -> bool:
        return not (self.not_kept or self.not_waiting or self.gone)

    @property
    def complete(self) -> bool:
        """Whether the pass saw every letter the DLQ held (another client held none of them)."""
        return self.scanned >= self.expected

    def as_json(self) -> dict[str, Any]:
        return {
            "agree": self.agree,
            "dlq": self.dlq,
            "in_dlq": self.expected,
            "scanned": self.scanned,
            "waiting": self.waiting,
            "not_kept": [row.event_id for row in self.not_kept],
            "not_waiting": [{"event_id": e, "state": state} for _, e, state in self.not_waiting],
            "gone": [event_id for _, event_id in self.gone],
            "copies_waiting": self.copies,
            "running": [row["operation_id"] for row in self.running],
        }


async def compare(dlq: DeadLetterQueue, audit: Audit, *, batch: int = DEFAULT_BATCH) -> Comparison:
    """One read pass over the DLQ against the table's rows (the waiting ones read before the pass: a row kept
    meanwhile is of a letter the pass sees, or one that arrived after it began, which it leaves)."""
    found = Comparison(dlq.name)
    running = await live(audit)
    found.running = [row for row in running if row["queue"] == dlq.name and row["state"] == "running"]
    waiting = {
        row["letter_key"]: row["event_id"]
        for row in await audit.query(f"SELECT letter_key, event_id FROM {KEPT} WHERE state = 'waiting'")
    }
    found.waiting = len(waiting)

    def keyed(message: AbstractIncomingMessage, letter: Letter) -> Keyed:
        key = letter_key(message.body, dict(message.headers or {}), message.message_id)
        row = None if key in waiting else kept_letter(message, dlq.topology, dlq.trusted)
        return Keyed(letter, len(message.body), key=key, row=row)

    seen: set[str] = set()
    unmatched: dict[str, KeptLetter] = {}
    async with await _read(dlq, keyed, batch) as reading:
        while (batch_found := await reading.next_batch()) is not None:
            for item in batch_found:
                assert isinstance(item, Keyed)
                seen.add(item.key)
                if item.row is not None:
                    unmatched[item.key] = item.row
        found.expected, found.scanned = reading.expected, reading.scanned
    states = {
        row["letter_key"]: row["state"]
        for row in await audit.query(
            f"SELECT letter_key, state FROM {KEPT} WHERE letter_key = ANY($1::text[])", list(unmatched)
        )
    }
    found.not_kept = [row for key, row in unmatched.items() if key not in states]
    found.not_waiting = [
        (key, row.event_id, states[key])
        for key, row in unmatched.items()
        if key in states and states[key] != "waiting"
    ]
    found.gone = [(key, event_id) for key, event_id in waiting.items() if key not in seen]
    found.copies = await copies_waiting(dlq)
    return found


async def _read(
    dlq: DeadLetterQueue, keyed: Callable[[AbstractIncomingMessage, Letter], Seen], batch: int
) -> Sweep[Seen] | Reading:
    """The read-only pass of ``list`` (reading.py ``read``), keeping each letter's key."""
    channel, expected = await dlq.open_pass(batch)
    pass_of = Sweep if expected > MAX_PREFETCH else Reading
    reading = pass_of(
        channel, dlq.name, dlq.topology, Selection(), keyed, expected=expected, batch=batch, limit=None,
        now=datetime.now(UTC), trusted=dlq.trusted,
    )  # fmt: skip
    if isinstance(reading, Reading):
        await reading.start()
    return reading


async def repair(comparison: Comparison, operation: Operation) -> tuple[int, int, int, int]:
    """Make the table agree with what the pass found, in one transaction: keep the letters not kept, set the
    rows of letters still in the DLQ back to waiting, mark the rows of letters gone ``purged`` (``expired``,
    when an expire left them pending; not when the pass missed letters). How many of each."""
    gone = [key for key, _ in comparison.gone] if comparison.complete else []
    back = [key for key, _, _ in comparison.not_waiting]
    try:
        async with operation.audit.transaction() as conn:
            await keep(conn, comparison.not_kept)
            await conn.execute(
                f"UPDATE {KEPT} SET operation_id = $1, state_detail = 'kept by `worker dlq repair`: its copy "
                "never reached the table' WHERE letter_key = ANY($2::text[]) AND operation_id IS NULL",
                operation.id,
                [row.letter_key for row in comparison.not_kept],
            )
            await conn.execute(
                f"UPDATE {KEPT} SET state = 'waiting', state_at = now(), operation_id = $1, state_detail = "
                "'in the DLQ although kept as ' || state || ': set back by `worker dlq repair`'"
                " WHERE letter_key = ANY($2::text[]) AND state <> 'waiting'",
                operation.id,
                back,
            )
            # a purge or expire stopped at once between the broker's removal and its record left the letter
            # pending there: its row takes that operation's state
            pending = await conn.execute(
                f"UPDATE {KEPT} k SET state = CASE p.action WHEN 'expire' THEN 'expired' ELSE 'purged' END,"
                " state_at = now(), operation_id = p.operation_id,"
                " state_detail = p.action || ' by ' || p.actor || ', stopped at once between its removal and"
                " its record: found by `worker dlq repair`'"
                f" FROM (SELECT DISTINCT ON (l.letter_key) l.letter_key, o.action, o.actor, o.operation_id"
                f" FROM {LETTERS} l JOIN {OPERATIONS} o USING (operation_id)"
                " WHERE l.letter_key = ANY($1::text[]) AND l.outcome = 'pending'"
                " AND o.action IN ('purge', 'expire') ORDER BY l.letter_key, o.started_at DESC) p"
                " WHERE k.letter_key = p.letter_key AND k.state = 'waiting'",
                gone,
            )
            await conn.execute(
                f"UPDATE {KEPT} SET state = 'purged', state_at = now(), operation_id = $1, state_detail = "
                "'gone from the DLQ outside the worker''s tools (a queue purged in RabbitMQ, another "
                "client): found by `worker dlq repair`'"
                " WHERE letter_key = ANY($2::text[]) AND state = 'waiting'",
                operation.id,
                gone,
            )
    except Exception as exc:
        raise AuditUnavailable(f"cannot repair {KEPT}: {type(exc).__name__}: {exc}") from None
    return len(comparison.not_kept), len(back), len(gone), int(pending.split()[-1])


def report(comparison: Comparison) -> str:
    """What ``check`` prints: the counts, each disagreement with (some of) its event ids, the copies queue."""
    c = comparison
    lines = [f"{c.dlq}: {c.expected} letter(s); {KEPT}: {c.waiting} waiting"]
    lines += _listed("in the DLQ, not kept", [row.event_id for row in c.not_kept])
    lines += _listed(
        "in the DLQ, kept as another state (an operation recorded it gone)",
        [f"{event_id or '-'} ({state})" for _, event_id, state in c.not_waiting],
    )
    lines += _listed("kept as waiting, gone from the DLQ", [event_id for _, event_id in c.gone])
    if c.copies is None:
        lines.append(f"no copies queue ({KEPT} keeps nothing: has a worker of this version run here?)")
    elif c.copies:
        lines.append(
            f"{c.copies} copies not kept yet in the copies queue: the keepers are behind, and the letters "
            "not kept may be among them (the difference may pass on its own)"
        )
    if not c.complete:
        lines.append(
            f"the pass saw {c.scanned} of the {c.expected} letters (another client held some meanwhile): "
            "what it did not see counts as gone here; run it again"
        )
    for row in c.running:
        lines.append(
            f"operation {row['operation_id']} ({row['action']} by {row['actor']}) runs on the DLQ: its "
            "letters move as the pass reads, so the result may be transient"
        )
    return "\n".join(terminal_safe(line) for line in lines)


def _listed(what: str, event_ids: Sequence[str | None]) -> list[str]:
    if not event_ids:
        return []
    shown = ", ".join(event_id or "-" for event_id in event_ids[:SHOWN])
    more = f" and {len(event_ids) - SHOWN} more" if len(event_ids) > SHOWN else ""
    return [f"{what}: {len(event_ids)}: {shown}{more}"]


async def check_command(
    url: str,
    dsn: str,
    topology: Topology,
    *,
    batch: int = DEFAULT_BATCH,
    as_json: bool = False,
    console: Console | None = None,
    trusted: frozenset[str] = frozenset(),
) -> int:
    """``worker dlq check``: exit 0 when the DLQ and the table's waiting rows agree, 1 when not."""
    console = console or Console()

    async def run() -> int:
        try:
            async with Audit.opened(dsn) as audit, open_dead_letters(url, topology, trusted=trusted) as dlq:
                found = await compare(dlq, audit, batch=batch)
        except AuditUnavailable as exc:
            return unavailable(exc, console)
        if as_json:
            console.out.write(orjson.dumps(found.as_json()).decode() + "\n")
        else:
            console.out.write(report(found) + "\n")
            console.out.write(
                "agree\n"
                if found.agree
                else "disagree: `worker dlq repair` keeps the letters not kept, sets the rows of letters in "
                "the DLQ back to waiting and marks the rows of letters gone purged\n"
            )
        return EXIT_OK if found.agree else EXIT_FAILED

    return await guarded(run(), url, console)


async def repair_command(
    url: str,
    topology: Topology,
    *,
    audit: Audited,
    batch: int = DEFAULT_BATCH,
    console: Console | None = None,
    trusted: frozenset[str] = frozenset(),
) -> int:
    """``worker dlq repair``: :func:`compare`, then :func:`repair`, on record (action ``repair``, alone on
    its DLQ: refused with exit 6 while another operation runs)."""
    console = console or Console()
    totals: Totals | None = None
    note: str | None = None

    async def run(operation: Operation) -> int:
        nonlocal totals, note
        async with open_dead_letters(url, topology, trusted=trusted) as dlq:
            found = await compare(dlq, operation.audit, batch=batch)
        totals = Totals(found.expected, found.scanned)
        console.out.write(report(found) + "\n")
        kept, back, gone, pending = await repair(found, operation)
        note = (
            f"kept {kept} letter(s) not kept, set {back} back to waiting, marked {gone} purged (gone "
            "from the DLQ)"
        )
        if pending:
            note += f"; {pending} of them as the purge or expire that had left them pending"
        if found.gone and not found.complete:
            note += f"; left {len(found.gone)} waiting: the pass did not see every letter"
        console.out.write(note + "\n")
        return EXIT_OK

    def ending() -> Ending:
        return totals, note, None

    return await audit.perform("repair", (Selection(), url, topology), console, run, ending)
