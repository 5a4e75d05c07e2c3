"""``worker dlq``'s commands: each connects, runs one operation, prints, and returns the exit code."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime

from worker.config import Topology
from worker.ops.dlq.audit import Operation
from worker.ops.dlq.audited import Audited, Ending
from worker.ops.dlq.console import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    Console,
    guarded,
)
from worker.ops.dlq.history import pairs_in
from worker.ops.dlq.kinds import replay_helps
from worker.ops.dlq.operations import StopFn, Totals, purge
from worker.ops.dlq.render import (
    Progress,
    list_header,
    list_line,
    terminal_safe,
)
from worker.ops.dlq.replaying import AS_RECORDED, Pace, Senders, replay
from worker.ops.dlq.selection import Selection
from worker.ops.dlq.sweep import DEFAULT_BATCH, Found, open_dead_letters


async def replay_command(
    url: str,
    topology: Topology,
    selection: Selection,
    *,
    batch: int = DEFAULT_BATCH,
    limit: int | None = None,
    dry_run: bool = False,
    progress: bool = False,
    audit: Audited | None = None,
    console: Console | None = None,
    stop: StopFn | None = None,
    trusted: frozenset[str] = frozenset(),
    senders: Senders = AS_RECORDED,
    rate: float | None = None,
) -> int:
    """``audit``: where the operation is recorded (the CLI always gives one; a dry run records nothing);
    ``rate``: letters a second (None: as fast as the broker confirms);
    ``stop``: whether Ctrl-C was pressed (the CLI's :class:`Interruption`), asked between batches;
    ``trusted``: LTM_TRUSTED_PUBLISHERS, by which each letter's sender is read; ``senders``: what becomes of a
    letter with none known (refused under LTM_SHARD_IDENTITY=required, unless ``--as-trusted-publisher``,
    which the audit records)."""
    console = console or Console()
    outcome: Totals | None = None
    hopeless: Counter[str] = Counter()
    unsent = 0

    def on_found(found: Found, now: datetime) -> None:
        nonlocal unsent
        if dry_run:
            console.out.write(list_line(found.letter, now) + "\n")
        if not replay_helps(found.letter.kind):
            hopeless[found.letter.kind] += 1
        if senders.refusal(found.letter) is not None:
            unsent += 1

    async def run(journal: Operation | None) -> int:
        nonlocal outcome
        async with open_dead_letters(url, topology, trusted=trusted) as dlq:
            if journal is not None and await journal.in_doubt_elsewhere():
                # an earlier replay was stopped at once: which of its copies came back tells what it sent
                journal.in_dlq = frozenset(await pairs_in(dlq))
            meter = _meter("replay", console, progress, rate) if not dry_run else None
            if dry_run:
                console.out.write(list_header() + "\n")
            try:
                outcome = await replay(
                    dlq, selection, batch=batch, limit=limit, dry_run=dry_run, on_found=on_found,
                    progress=meter, journal=journal, stop=stop, senders=senders,
                    pace=None if rate is None else Pace(rate),
                )  # fmt: skip
            finally:
                if meter is not None:
                    meter.finish()
            if unsent:
                verb = "would not be replayed" if dry_run else "were not replayed"
                console.err.write(
                    f"note: {unsent} of them have no known sender and {verb}: under "
                    "LTM_SHARD_IDENTITY=required the worker refuses them; `worker dlq show EVENT_ID` says "
                    "why, and --as-trusted-publisher replays them as your own events (on record)\n"
                )
            return _replayed(outcome, dry_run, hopeless, console)

    def ending() -> Ending:
        if outcome is not None and outcome.cancelled_by is not None:
            return outcome, f"cancelled by {outcome.cancelled_by}", "cancelled"
        failed = 0 if outcome is None else len(outcome.failures)
        return outcome, f"{failed} not replayed" if failed else None, None

    if dry_run or audit is None:
        return await guarded(run(None), url, console)
    where = (selection, url, topology)
    # the operator's choice to vouch for letters with no known sender is on record with the filters
    chosen = {"as_trusted_publisher": True} if senders.as_trusted_publisher else None
    return await audit.perform(
        "replay", where, console, run, ending, limit=limit, stop=stop, options=chosen, rate=rate
    )


def _replayed(totals: Totals, dry_run: bool, hopeless: Counter[str], console: Console) -> int:
    """What a replay says when it is done, and its exit code."""
    if dry_run:
        console.out.write(
            f"dry run: would move {totals.selected}, keep {totals.kept - totals.selected}; nothing moved\n"
        )
        console.err.write(_hopeless_note(hopeless, "would fail again"))
        return EXIT_OK
    for event_id, why in totals.failures:
        console.err.write(f"not replayed: {terminal_safe(event_id or '-')}: {terminal_safe(why)}\n")
    if totals.cancelled_by is not None:
        console.out.write(
            f"cancelled by {terminal_safe(totals.cancelled_by)} once the letters in flight were settled: "
            f"moved {totals.removed}, kept {totals.kept} (every letter is replayed or still in the DLQ)\n"
        )
    else:
        console.out.write(f"moved {totals.removed}, kept {totals.kept}\n")
    if totals.replayed_before:
        console.err.write(
            f"note: {totals.replayed_before} of them had been sent by an earlier replay that was stopped at "
            "once; their originals were removed, not sent again (`worker dlq history` says which)\n"
        )
    console.err.write(_hopeless_note(hopeless, "will fail again"))
    if totals.cancelled_by is not None:
        return EXIT_INTERRUPTED
    return EXIT_FAILED if totals.failures else EXIT_OK


async def purge_command(
    url: str,
    topology: Topology,
    selection: Selection,
    *,
    yes: bool,
    batch: int = DEFAULT_BATCH,
    progress: bool = False,
    ask: Callable[[str], Awaitable[str]] | None = None,
    audit: Audited | None = None,
    console: Console | None = None,
    stop: StopFn | None = None,
) -> int:
    """``ask`` shows the prompt and returns the answer (default: ``input`` on the terminal); ``audit``:
    where the operation is recorded (the CLI always gives one); ``stop``: as for :func:`replay_command`."""
    console = console or Console()
    outcome: Totals | None = None
    if not yes and ask is None and not sys.stdin.isatty():
        why = "stdin is not a terminal, so there is no one to confirm"
        console.err.write(f"refusing to purge: {why}; pass --yes to delete without asking\n")
        if audit is not None:
            await audit.refusal("purge", selection, url, topology, why, console)
        return EXIT_USAGE
    prompt = ask or _ask_on_terminal
    declined = False
    meter = _meter("purge", console, progress)

    async def confirm(count: int) -> bool:
        nonlocal declined
        if meter is not None:
            meter.finish()
        answer = await prompt(f"Delete {count} dead letters? [y/N] ")
        declined = answer.strip().lower() not in ("y", "yes")
        return not declined

    async def run(journal: Operation | None) -> int:
        nonlocal outcome
        async with open_dead_letters(url, topology) as dlq:
            try:
                outcome = await purge(
                    dlq, selection, batch=batch, confirm=None if yes else confirm, progress=meter,
                    journal=journal, stop=stop,
                )  # fmt: skip
            finally:
                if meter is not None:
                    meter.finish()
            if declined:
                console.out.write(f"nothing deleted, kept {outcome.kept}\n")
                return EXIT_FAILED
            console.out.write(f"deleted {outcome.removed}, kept {outcome.kept}\n")
        return EXIT_OK

    def ending() -> Ending:
        return (outcome, "not confirmed", "refused") if declined else (outcome, None, None)

    if audit is None:
        return await guarded(run(None), url, console)
    return await audit.perform("purge", (selection, url, topology), console, run, ending, stop=stop)


def _hopeless_note(kinds: Counter[str], verb: str) -> str:
    """A line on the letters a replay cannot help (empty when there are none)."""
    if not kinds:
        return ""
    counted = ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
    return (
        f"note: {sum(kinds.values())} of them ({counted}) {verb} and come back to the DLQ: the worker "
        "refuses them for what they are, not for a fault that passes (`worker dlq show EVENT_ID` says what "
        "to do)\n"
    )


async def _ask_on_terminal(prompt: str) -> str:
    try:
        return await asyncio.to_thread(input, prompt)
    except EOFError:
        return ""


def _meter(verb: str, console: Console, forced: bool, rate: float | None = None) -> Progress | None:
    """A progress line when a person watches stderr, or when asked for (``rate``: what it is paced at)."""
    live = console.err.isatty()
    return Progress(verb, console.err, live=live, rate=rate) if live or forced else None
