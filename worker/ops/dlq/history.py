"""``worker dlq history``: the audit record of replays and purges, newest first."""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from worker.ops.dlq.audit import Audit, AuditUnavailable
from worker.ops.dlq.console import EXIT_AUDIT, EXIT_FAILED, EXIT_OK, EXIT_USAGE, Console
from worker.ops.dlq.render import terminal_safe


async def history_command(
    dsn: str,
    *,
    as_json: bool = False,
    limit: int = 50,
    operation: str | None = None,
    console: Console | None = None,
) -> int:
    """``worker dlq history``: the audit record, newest first."""
    console = console or Console()
    operation_id = None
    if operation is not None:
        try:
            operation_id = uuid.UUID(operation)
        except ValueError:
            console.err.write(f"not an operation id: {operation!r}\n")
            return EXIT_USAGE
    try:
        audit = await Audit.open(dsn)
    except AuditUnavailable as exc:
        console.err.write(f"{exc}\n")
        return EXIT_AUDIT
    try:
        operations = await audit.history(limit=limit, operation_id=operation_id)
        if operation_id is not None:
            if not operations:
                console.err.write(f"no operation {operation_id} in the audit record\n")
                return EXIT_FAILED
            operations[0]["letter_outcomes"] = await audit.letters(operation_id)
    finally:
        await audit.close()
    for entry in operations:
        console.out.write((orjson.dumps(entry).decode() if as_json else history_lines(entry)) + "\n")
    if not as_json:
        console.err.write(f"{len(operations)} operation(s)\n")
    return EXIT_OK


def history_lines(entry: dict[str, Any]) -> str:
    """An operation for people: one line, then one line per letter when they were asked for."""
    letters = ", ".join(f"{outcome} {n}" for outcome, n in entry["letters"].items()) or "no letters"
    filters = " ".join(
        f"{key}={','.join(map(str, value)) if isinstance(value, list) else value}"
        for key, value in entry["filters"].items()
    )
    line = (
        f"{entry['operation_id']}  {entry['started_at']}  {entry['action']:<6}  {entry['state']:<11}  "
        f"by {entry['actor']}  [{letters}]  {filters or 'all'}"
    )
    if entry["detail"]:
        line += f"  ({entry['detail']})"
    lines = [terminal_safe(line)]
    for letter in entry.get("letter_outcomes", ()):
        text = (
            f"  {letter['position']:>6}  {letter['event_id'] or '-'}  {letter['kind']}  {letter['outcome']}"
        )
        if letter["detail"]:
            text += f"  {letter['detail']}"
        lines.append(terminal_safe(text))
    return "\n".join(lines)
