"""``worker dlq``'s commands: each connects, runs one operation, prints, and returns the exit code."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TextIO

import aiormq.exceptions

from worker.config import Topology
from worker.config import redact_url as redact
from worker.dlq.letters import Selection
from worker.dlq.operations import browse, purge, replay
from worker.dlq.render import Progress, format_message, json_line, list_header, list_line
from worker.dlq.sweep import DEFAULT_BATCH, DlqError, Found, Undeclared, error_text, open_dead_letters

EXIT_OK = 0  # also when nothing was selected: an empty list, or nothing to replay or purge, is an answer
EXIT_FAILED = 1  # show: not found; replay: some could not be republished; purge: declined
EXIT_USAGE = 2  # bad options; purge without --yes and without a terminal to ask on
EXIT_UNREACHABLE = 3  # RabbitMQ cannot be reached (or the connection died mid-way)
EXIT_MISSING = 4  # the DLQ (or, for replay, the work exchange) does not exist on the vhost
EXIT_INTERRUPTED = 130

EXIT_CODES_HELP = """
exit codes:
  0  done, also when nothing matched (list prints no lines; replay and purge move or delete 0)
  1  show: no such dead letter; replay: some dead letters could not be republished (they stay in the DLQ);
     purge: not confirmed
  2  bad options; purge without --yes when stdin is not a terminal
  3  RabbitMQ cannot be reached (or the connection was lost; nothing is lost with it)
  4  the DLQ (replay: or the work exchange) does not exist on the vhost
  130  interrupted (Ctrl-C); whatever was not settled stays in the DLQ
"""


@dataclass(frozen=True, slots=True)
class Console:
    """Where a command writes, and whether a person is watching."""

    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)


async def list_command(
    url: str,
    topology: Topology,
    selection: Selection,
    *,
    batch: int = DEFAULT_BATCH,
    as_json: bool = False,
    console: Console | None = None,
) -> int:
    console = console or Console()

    async def run() -> int:
        async with open_dead_letters(url, topology) as dlq:
            headed = as_json  # JSON lines have no header; the table's comes with its first row

            def emit(found: Found, now: datetime) -> None:
                nonlocal headed
                if not headed:
                    console.out.write(list_header() + "\n")
                    headed = True
                line = json_line(found.letter) if as_json else list_line(found.letter, now)
                console.out.write(line + "\n")

            totals = await browse(dlq, selection, emit, batch=batch)
            console.out.flush()
            console.err.write(f"{totals.selected} of {totals.scanned} dead letters in {dlq.name}\n")
        return EXIT_OK

    return await _guarded(run(), url, console)


async def show_command(
    url: str,
    topology: Topology,
    event_id: str,
    *,
    batch: int = DEFAULT_BATCH,
    console: Console | None = None,
) -> int:
    console = console or Console()

    async def run() -> int:
        async with open_dead_letters(url, topology) as dlq:
            shown: list[str] = []
            await browse(
                dlq,
                Selection(event_ids=frozenset({event_id})),
                lambda found, now: shown.append(format_message(found, now)),
                batch=batch,
            )
            if not shown:
                console.err.write(f"no dead letter with event id {event_id} in {dlq.name}\n")
                return EXIT_FAILED
            for n, text in enumerate(shown, 1):
                if len(shown) > 1:
                    console.out.write(f"--- dead letter {n} of {len(shown)} ---\n")
                console.out.write(text + "\n")
        return EXIT_OK

    return await _guarded(run(), url, console)


async def replay_command(
    url: str,
    topology: Topology,
    selection: Selection,
    *,
    batch: int = DEFAULT_BATCH,
    limit: int | None = None,
    dry_run: bool = False,
    progress: bool = False,
    console: Console | None = None,
) -> int:
    console = console or Console()

    async def run() -> int:
        async with open_dead_letters(url, topology) as dlq:
            meter = _meter("replay", console, progress) if not dry_run else None
            on_found = None
            if dry_run:
                console.out.write(list_header() + "\n")

                def on_found(found: Found, now: datetime) -> None:
                    console.out.write(list_line(found.letter, now) + "\n")

            try:
                totals = await replay(
                    dlq,
                    selection,
                    batch=batch,
                    limit=limit,
                    dry_run=dry_run,
                    on_found=on_found,
                    progress=meter,
                )
            finally:
                if meter is not None:
                    meter.finish()
            if dry_run:
                console.out.write(
                    f"dry run: would move {totals.selected}, keep {totals.kept - totals.selected}; "
                    "nothing moved\n"
                )
                return EXIT_OK
            for event_id, why in totals.failures:
                console.err.write(f"not replayed: {event_id or '-'}: {why}\n")
            console.out.write(f"moved {totals.removed}, kept {totals.kept}\n")
            return EXIT_FAILED if totals.failures else EXIT_OK

    return await _guarded(run(), url, console)


async def purge_command(
    url: str,
    topology: Topology,
    selection: Selection,
    *,
    yes: bool,
    batch: int = DEFAULT_BATCH,
    progress: bool = False,
    ask: Callable[[str], Awaitable[str]] | None = None,
    console: Console | None = None,
) -> int:
    """``ask`` shows the prompt and returns the answer (default: ``input`` on the terminal)."""
    console = console or Console()
    if not yes and ask is None and not sys.stdin.isatty():
        console.err.write(
            "refusing to purge: stdin is not a terminal, so there is no one to confirm; "
            "pass --yes to delete without asking\n"
        )
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

    async def run() -> int:
        async with open_dead_letters(url, topology) as dlq:
            try:
                totals = await purge(
                    dlq, selection, batch=batch, confirm=None if yes else confirm, progress=meter
                )
            finally:
                if meter is not None:
                    meter.finish()
            if declined:
                console.out.write(f"nothing deleted, kept {totals.kept}\n")
                return EXIT_FAILED
            console.out.write(f"deleted {totals.removed}, kept {totals.kept}\n")
        return EXIT_OK

    return await _guarded(run(), url, console)


async def _ask_on_terminal(prompt: str) -> str:
    try:
        return await asyncio.to_thread(input, prompt)
    except EOFError:
        return ""


def _meter(verb: str, console: Console, forced: bool) -> Progress | None:
    """A progress line when a person watches stderr, or when asked for."""
    live = console.err.isatty()
    return Progress(verb, console.err, live=live) if live or forced else None


async def _guarded(work: Awaitable[int], url: str, console: Console) -> int:
    """Run a command; turn the failures an operator can act on into a message and an exit code."""
    try:
        return await work
    except DlqError as exc:
        console.err.write(f"{exc}\n")
        return EXIT_MISSING if isinstance(exc, Undeclared) else EXIT_UNREACHABLE
    except BrokenPipeError:  # `worker dlq list | head`: the reader has seen enough; the sweep requeued all
        return EXIT_OK
    except (OSError, TimeoutError, aiormq.exceptions.AMQPError) as exc:
        console.err.write(
            f"lost the connection to RabbitMQ at {redact(url)}: {error_text(exc)} "
            "(dead letters not yet settled stay in the queue)\n"
        )
        return EXIT_UNREACHABLE
