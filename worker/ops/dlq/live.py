"""``worker dlq operations`` and ``worker dlq cancel``: what runs now, from any machine that reaches the audit
database, and stopping a replay from another terminal (running.py writes and reads the rows)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import orjson

from worker.ops.dlq.audit import Audit, AuditUnavailable
from worker.ops.dlq.console import EXIT_BUSY, EXIT_FAILED, EXIT_OK, EXIT_USAGE, Console, unavailable
from worker.ops.dlq.render import terminal_safe
from worker.ops.dlq.running import ask_to_stop, live, state_of

#: how long ``cancel`` waits for the replay to settle what it holds and stop, unless ``--wait`` says
DEFAULT_WAIT = 60.0
#: how often ``cancel`` looks whether it stopped
POLL_SECONDS = 0.25


async def operations_command(dsn: str, *, as_json: bool = False, console: Console | None = None) -> int:
    """``worker dlq operations``: every replay and purge whose record is open, oldest first."""
    console = console or Console()
    try:
        async with Audit.opened(dsn) as audit:
            rows = await live(audit)
    except AuditUnavailable as exc:
        return unavailable(exc, console)
    if rows and not as_json:
        console.out.write(operations_header() + "\n")
    for row in rows:
        console.out.write((orjson.dumps(row).decode() if as_json else operations_line(row)) + "\n")
    console.out.flush()
    if not as_json:
        lost = sum(1 for row in rows if row["state"] == "lost")
        console.err.write(
            f"{len(rows) - lost} running, {lost} lost (stopped without closing their record: the next replay "
            "of their DLQ, or `worker dlq cancel ID`, closes it)\n"
            if lost
            else f"{len(rows)} running\n"
        )
    return EXIT_OK


def operations_header() -> str:
    return (
        f"{'OPERATION':<36}  {'ACTION':<6}  {'STATE':<7}  {'RATE':>6}  {'MOVED/SELECTED':>15}  "
        f"{'SCANNED/DLQ':>13}  {'STARTED':<20}  {'HEARTBEAT':<20}  BY"
    )


def operations_line(row: dict[str, Any]) -> str:
    rate = "-" if row["rate"] is None else f"{row['rate']:g}/s"
    line = (
        f"{row['operation_id']:<36}  {row['action']:<6}  {row['state']:<7}  {rate:>6}  "
        f"{row['moved']:>7}/{row['selected']:<7}  {row['scanned']:>6}/{row['expected']:<6}  "
        f"{row['started_at'] or '-':<20}  {row['heartbeat_at'] or '-':<20}  {row['actor']}"
    )
    if row["cancelled_by"]:
        line += f"  (cancel asked by {row['cancelled_by']})"
    return terminal_safe(line)


async def cancel_command(
    dsn: str,
    operation: str,
    *,
    actor: str,
    wait: float = DEFAULT_WAIT,
    console: Console | None = None,
) -> int:
    """``worker dlq cancel OPERATION_ID``: ask a running replay to stop and wait until it has (it settles the
    round in flight first). 0 once it stopped (or had already), 1 no such operation or not a replay, 6 still
    running after ``wait`` seconds."""
    console = console or Console()
    try:
        operation_id = uuid.UUID(operation)
    except ValueError:
        console.err.write(f"not an operation id: {operation!r} (`worker dlq operations` lists them)\n")
        return EXIT_USAGE
    try:
        async with Audit.opened(dsn) as audit:
            return await _cancel(audit, operation_id, actor, wait, console)
    except AuditUnavailable as exc:
        return unavailable(exc, console)


async def _cancel(audit: Audit, operation_id: uuid.UUID, actor: str, wait: float, console: Console) -> int:
    before = await state_of(audit, operation_id)
    if before is None:
        console.err.write(f"no operation {operation_id} in the audit record (`worker dlq operations`)\n")
        return EXIT_FAILED
    if before["action"] != "replay":
        console.err.write(
            f"operation {operation_id} is a {before['action']}: only a replay can be cancelled (a purge asks "
            "before it deletes, and Ctrl-C in its terminal stops it)\n"
        )
        return EXIT_FAILED
    if before["state"] not in ("running", "lost"):
        console.out.write(f"operation {operation_id} is not running: it ended {_ended(before)}\n")
        return EXIT_OK
    now = await ask_to_stop(audit, operation_id, actor)
    assert now is not None
    if now["state"] == "running":
        console.err.write(
            f"asked replay {operation_id} (by {terminal_safe(now['actor'])}, {now['moved']} of "
            f"{now['selected']} moved so far) to stop; it settles the letters in flight first\n"
        )
        if wait == 0:
            return EXIT_OK
        deadline = time.monotonic() + wait
        while now["state"] == "running" and time.monotonic() < deadline:
            await asyncio.sleep(POLL_SECONDS)
            now = await state_of(audit, operation_id) or now
        if now["state"] == "running":
            console.err.write(
                f"replay {operation_id} still runs after {wait:g}s (its heartbeat is {now['heartbeat_at']}); "
                "it stops at its next round, or is taken as lost once its heartbeat is older than 15 s\n"
            )
            return EXIT_BUSY
    console.out.write(f"operation {operation_id} stopped: {_ended(now)}\n")
    return EXIT_OK


def _ended(row: dict[str, Any]) -> str:
    text = f"{row['state']} at {row['finished_at'] or '-'}, {row['moved']} of {row['selected']} moved"
    if row["detail"]:
        text += f" ({row['detail']})"
    return terminal_safe(text)
