"""``worker dlq list`` and ``show``: from the letters kept in Postgres (the broker delivers nothing), or with
``--from-queue`` from a read-only pass over the DLQ (every letter taken and put back)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from worker.config import Topology
from worker.ops.dlq.audit import AuditUnavailable
from worker.ops.dlq.console import EXIT_FAILED, EXIT_OK, Console, guarded, unavailable
from worker.ops.dlq.groups import Grouping, group_header, group_json_line, group_line
from worker.ops.dlq.kept import KeptLetters, copies_waiting, disagreement
from worker.ops.dlq.operations import Totals, browse
from worker.ops.dlq.reading import Seen
from worker.ops.dlq.render import format_message, json_line, list_header, list_line
from worker.ops.dlq.selection import Selection
from worker.ops.dlq.sweep import DEFAULT_BATCH, DeadLetterQueue, open_dead_letters

#: how long a read of the table waits for the keepers to keep what the DLQ holds: while copies wait, and
#: while none waits but the table and the DLQ differ; and how often it looks
CATCH_UP_SECONDS = 3.0
SETTLE_SECONDS = 0.5
CATCH_UP_POLL = 0.05

#: where a list reads its letters: it calls ``on_found`` for each selected one and says how many it saw
Source = Callable[[Selection, Callable[[Seen, datetime], None]], Awaitable[Totals]]


async def list_command(
    url: str,
    topology: Topology,
    selection: Selection,
    *,
    batch: int = DEFAULT_BATCH,
    as_json: bool = False,
    group_by: str | None = None,
    console: Console | None = None,
    trusted: frozenset[str] = frozenset(),
    dsn: str | None = None,
) -> int:
    """``worker dlq list``: from the letters kept in Postgres (``dsn``), else (``--from-queue``, or no
    ``dsn``) from a read-only pass over the DLQ."""
    console = console or Console()

    async def run(source: Source) -> int:
        if group_by is not None:
            return await _list_groups(source, topology, selection, group_by, as_json, console)
        headed = as_json  # JSON lines have no header; the table's comes with its first row

        def emit(found: Seen, now: datetime) -> None:
            nonlocal headed
            if not headed:
                console.out.write(list_header() + "\n")
                headed = True
            line = json_line(found.letter) if as_json else list_line(found.letter, now)
            console.out.write(line + "\n")

        totals = await source(selection, emit)
        console.out.flush()
        console.err.write(
            f"{totals.selected} of {totals.scanned} dead letters in {topology.dead_letter_queue}\n"
        )
        return EXIT_OK

    if dsn is None:
        return await guarded(_from_queue(url, topology, trusted, batch, run), url, console)
    return await _from_table(dsn, url, topology, trusted, console, lambda kept: run(kept.browse))


async def _from_queue(
    url: str,
    topology: Topology,
    trusted: frozenset[str],
    batch: int,
    run: Callable[[Source], Awaitable[int]],
    *,
    details: bool = False,
) -> int:
    """``run`` over a read-only pass of the DLQ (every letter taken and put back)."""
    async with open_dead_letters(url, topology, trusted=trusted) as dlq:

        async def source(selection: Selection, on_found: Callable[[Seen, datetime], None]) -> Totals:
            return await browse(dlq, selection, on_found, batch=batch, details=details)

        return await run(source)


async def _from_table(
    dsn: str,
    url: str,
    topology: Topology,
    trusted: frozenset[str],
    console: Console,
    use: Callable[[KeptLetters], Awaitable[int]],
) -> int:
    """``use`` the letters kept in Postgres, once the DLQ is known to exist (a passive declare, as a read
    of the queue begins: the same exit codes when it cannot be reached); then a line on stderr if the DLQ
    holds another number of letters than the table says wait in it."""

    async def work() -> int:
        async with open_dead_letters(url, topology, trusted=trusted) as dlq:
            try:
                async with KeptLetters.opened(dsn, topology, trusted) as kept:
                    copies, waiting = await _caught_up(dlq, kept)
                    code = await use(kept)
            except AuditUnavailable as exc:
                return unavailable(exc, console)
            note = disagreement(dlq, copies, waiting)
            if note:
                console.err.write(note + "\n")
            return code

    return await guarded(work(), url, console)


async def _caught_up(dlq: DeadLetterQueue, kept: KeptLetters) -> tuple[int | None, int]:
    """Wait for the keepers to keep what was dead-lettered a moment ago; then the copies waiting and the
    letters kept as waiting. While copies wait, at most :data:`CATCH_UP_SECONDS`; with none waiting but fewer
    or more letters kept than the DLQ holds, at most :data:`SETTLE_SECONDS` (a keeper's batch in hand: taken
    from the copies queue, not written yet). A disagreement that lasts (letters dead-lettered before the
    copies queue existed, a queue purged by other means) costs a list that, and is said."""
    started = time.monotonic()
    while True:
        copies = await copies_waiting(dlq)
        waiting = await kept.count_waiting()
        if copies is None or (copies == 0 and waiting == dlq.depth):
            return copies, waiting
        if time.monotonic() - started > (CATCH_UP_SECONDS if copies else SETTLE_SECONDS):
            return copies, waiting
        await asyncio.sleep(CATCH_UP_POLL)
        await dlq.recount()


async def _list_groups(
    source: Source,
    topology: Topology,
    selection: Selection,
    group_by: str,
    as_json: bool,
    console: Console,
) -> int:
    """``list --group-by``: one line per group, largest first."""
    grouping = Grouping(group_by)
    totals = await source(selection, lambda found, _now: grouping.add(found.letter))
    groups = grouping.groups
    if groups and not as_json:
        console.out.write(group_header() + "\n")
    for group in groups:
        console.out.write((group_json_line(group) if as_json else group_line(group)) + "\n")
    console.out.flush()
    console.err.write(
        f"{totals.selected} of {totals.scanned} dead letters in {topology.dead_letter_queue}, "
        f"{len(groups)} group(s) by {group_by}\n"
    )
    if not as_json and any(group.replay_helps != "yes" for group in groups):
        console.err.write(
            "REPLAY_HELPS no: a replay of the group fails again (some: of some of its letters); "
            "`worker dlq show EVENT_ID` says what to do\n"
        )
    return EXIT_OK


async def show_command(
    url: str,
    topology: Topology,
    event_id: str,
    *,
    batch: int = DEFAULT_BATCH,
    console: Console | None = None,
    trusted: frozenset[str] = frozenset(),
    dsn: str | None = None,
) -> int:
    """``trusted``: LTM_TRUSTED_PUBLISHERS, by which "published by" is read (``worker.broker.published_by``).
    From the letters kept in Postgres (``dsn``: those that left the DLQ too, each with its state), else from
    a read-only pass over the DLQ."""
    console = console or Console()
    if dsn is not None:
        return await _show_kept(dsn, url, topology, event_id, trusted, console)

    async def run(source: Source) -> int:
        shown: list[str] = []
        await source(
            Selection(event_ids=frozenset({event_id})),
            lambda found, now: shown.append(format_message(found, now)),
        )
        return _print_shown(
            shown, f"no dead letter with event id {event_id} in {topology.dead_letter_queue}", console
        )

    return await guarded(_from_queue(url, topology, trusted, batch, run, details=True), url, console)


async def _show_kept(
    dsn: str, url: str, topology: Topology, event_id: str, trusted: frozenset[str], console: Console
) -> int:
    """``show`` from the table: every letter with the event id, also those that left the DLQ, each with its
    state."""

    async def show(kept: KeptLetters) -> int:
        now = datetime.now(UTC)
        shown = [format_message(seen, now) for seen in await kept.whole(event_id)]
        return _print_shown(
            shown, f"no dead letter with event id {event_id} in {topology.dead_letter_queue}", console
        )

    return await _from_table(dsn, url, topology, trusted, console, show)


def _print_shown(shown: list[str], missing: str, console: Console) -> int:
    if not shown:
        console.err.write(missing + "\n")
        return EXIT_FAILED
    for n, text in enumerate(shown, 1):
        if len(shown) > 1:
            console.out.write(f"--- dead letter {n} of {len(shown)} ---\n")
        console.out.write(text + "\n")
    return EXIT_OK
