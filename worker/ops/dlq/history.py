"""``worker dlq history``: the audit record of replays and purges, newest first, and which replayed letters
came back to the DLQ.

A replay is ``done`` once the broker confirmed every copy, but a letter the worker refuses again
(``schema``, ``malformed``...) is back in the DLQ a moment later. Each operation records every letter's
``x-ltm-replay-count`` as it takes it, and a replayed copy carries one more: a letter with the same event id
and that count, taken by a later replay or purge or in the DLQ now, is the replayed one, come back. The record
answers the first; for the second, history reads the DLQ (only when some replayed letter is not accounted
for by the record; a read like ``list``'s).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import aiormq.exceptions
import orjson

from worker.broker.dead_letters import Letter
from worker.broker.headers import rfc3339
from worker.config import Topology
from worker.ops.dlq.audit import Audit, AuditUnavailable
from worker.ops.dlq.console import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Console, unavailable
from worker.ops.dlq.operations import browse
from worker.ops.dlq.record import LETTERS, OPERATIONS
from worker.ops.dlq.render import terminal_safe
from worker.ops.dlq.selection import Selection
from worker.ops.dlq.sweep import DeadLetterQueue, DlqError, open_dead_letters
from worker.redact import describe

#: how a replayed letter that came back is said
CAME_BACK = "came back to the DLQ: its replay failed again"
#: how a letter whose original and copy are both in the DLQ is said
TWICE = "in the DLQ twice, original and copy: replaying again removes the original"


def returned(letters: Collection[Letter]) -> set[tuple[str, int]]:
    """The (event id, replay count) of ``letters``: a replayed copy carries its original's count plus one, so
    a letter came back when its copy is among them, and is there twice when the original is too."""
    return {(x.event_id, x.replay_count) for x in letters if x.event_id is not None}


async def pairs_in(dlq: DeadLetterQueue) -> set[tuple[str, int]]:
    """The (event id, replay count) of every letter in the DLQ now (one read, as ``list`` makes)."""
    letters: list[Letter] = []
    await browse(dlq, Selection(), lambda seen, _now: letters.append(seen.letter))
    return returned(letters)


async def in_dlq_now(url: str, topology: Topology) -> set[tuple[str, int]]:
    """:func:`pairs_in` the DLQ at ``url``."""
    async with open_dead_letters(url, topology) as dlq:
        return await pairs_in(dlq)


@dataclass
class Record:
    """The operations asked for, and why the DLQ could not be read to finish ``came_back`` (None: it was, or
    the record answered it all)."""

    entries: list[dict[str, Any]]
    unchecked: str | None = None


async def read_record(
    audit: Audit,
    *,
    limit: int,
    operation_id: uuid.UUID | None = None,
    url: str | None = None,
    topology: Topology | None = None,
    in_dlq: Collection[tuple[str, int]] | None = None,
) -> Record:
    """The latest operations (with ``operation_id``: that one, with its letters), each with ``came_back``;
    ``in_dlq``: what the DLQ holds, when the caller has just read it (else it is read here if it matters)."""
    unchecked = None
    if in_dlq is None:
        in_dlq = set()
        if await audit.undecided(limit=limit, operation_id=operation_id):
            if url is None or topology is None:
                unchecked = "no RabbitMQ to read"
            else:
                try:
                    in_dlq = await in_dlq_now(url, topology)
                except DlqError as exc:
                    unchecked = str(exc)
                except (OSError, TimeoutError, aiormq.exceptions.AMQPError) as exc:
                    unchecked = describe(exc)
    entries = await audit.history(limit=limit, operation_id=operation_id, in_dlq=in_dlq)
    if operation_id is not None and entries:
        entries[0]["letter_outcomes"] = await audit.letters(operation_id, in_dlq)
    for entry in entries:
        entry["came_back_checked"] = unchecked is None
    return Record(entries, unchecked)


async def history_command(
    dsn: str,
    *,
    url: str | None = None,
    topology: Topology | None = None,
    as_json: bool = False,
    limit: int = 50,
    operation: str | None = None,
    console: Console | None = None,
) -> int:
    """``worker dlq history``: the audit record, newest first (``url``: the broker whose DLQ says which
    replayed letters came back)."""
    console = console or Console()
    operation_id = None
    if operation is not None:
        try:
            operation_id = uuid.UUID(operation)
        except ValueError:
            console.err.write(f"not an operation id: {operation!r}\n")
            return EXIT_USAGE
    try:
        async with Audit.opened(dsn) as audit:
            record = await read_record(
                audit, limit=limit, operation_id=operation_id, url=url, topology=topology
            )
    except AuditUnavailable as exc:
        return unavailable(exc, console)
    if operation_id is not None and not record.entries:
        console.err.write(f"no operation {operation_id} in the audit record\n")
        return EXIT_FAILED
    for entry in record.entries:
        console.out.write((orjson.dumps(entry).decode() if as_json else history_lines(entry)) + "\n")
    if record.unchecked is not None:
        console.err.write(
            f"could not read the DLQ to see which replayed letters came back ({record.unchecked}): 'came "
            "back' counts only what later replays and purges recorded\n"
        )
    if not as_json:
        console.err.write(f"{len(record.entries)} operation(s)\n")
    return EXIT_OK


def letters_text(entry: dict[str, Any]) -> str:
    """``replayed 3 (1 came back to the DLQ: ...)``: the letters of an operation counted by outcome."""
    text = ", ".join(f"{outcome} {n}" for outcome, n in entry["letters"].items()) or "no letters"
    if entry["came_back"]:
        text += f" ({entry['came_back']} {CAME_BACK})"
    if entry.get("twice"):
        text += f" ({entry['twice']} {TWICE})"
    return text


def history_lines(entry: dict[str, Any]) -> str:
    """An operation for people: one line, then one line per letter when they were asked for."""
    filters = " ".join(
        f"{key}={','.join(map(str, value)) if isinstance(value, list) else value}"
        for key, value in entry["filters"].items()
    )
    line = (
        f"{entry['operation_id']}  {entry['started_at']}  {entry['action']:<6}  {entry['state']:<11}  "
        f"by {entry['actor']}  [{letters_text(entry)}]  {filters or 'all'}"
    )
    if entry["detail"]:
        line += f"  ({entry['detail']})"
    lines = [terminal_safe(line)]
    for letter in entry.get("letter_outcomes", ()):
        text = (
            f"  {letter['position']:>6}  {letter['event_id'] or '-'}  {letter['kind']}  {letter['outcome']}"
        )
        if letter["came_back"]:
            text += f", {CAME_BACK}"
        if letter.get("twice"):
            text += f", {TWICE}"
        if letter["detail"]:
            text += f"  {letter['detail']}"
        lines.append(terminal_safe(text))
    return "\n".join(lines)


async def life(audit: Audit, event_id: str) -> list[dict[str, Any]]:
    """What the record knows of one event's dead letters, oldest first: every replay or purge that took one
    (when, which operation, by whom, at what rate, how it ended, with which replay count), and the worker's
    answer to it (``ltm_processed_events``) when there is one."""
    rows = await audit.query(
        f"""
        SELECT l.recorded_at AS at, o.operation_id, o.action, o.actor, o.rate, o.state, l.outcome, l.detail,
               l.replay_count
        FROM {LETTERS} l JOIN {OPERATIONS} o USING (operation_id)
        WHERE l.event_id = $1 ORDER BY l.recorded_at, l.position
        """,
        event_id,
    )
    steps = [
        {
            "at": rfc3339(row["at"]),
            "operation_id": str(row["operation_id"]),
            "action": row["action"],
            "actor": row["actor"],
            "rate": row["rate"],
            "operation_state": row["state"],
            "outcome": row["outcome"],
            "detail": row["detail"],
            "replay_count": row["replay_count"],
        }
        for row in rows
    ]
    try:
        key = uuid.UUID(event_id)
    except ValueError:
        return steps
    answered = await audit.query(
        "SELECT status, processed_at FROM public.ltm_processed_events WHERE event_id = $1 AND processed_at IS"
        " NOT NULL",
        key,
    )
    for row in answered:
        steps.append({"at": rfc3339(row["processed_at"]), "answered": row["status"]})
    return sorted(steps, key=lambda step: step["at"])
