"""``worker dlq``'s commands: each connects, runs one operation, prints, and returns the exit code."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TextIO

import aiormq.exceptions

from contracts.models import DeadLetterKind
from worker.config import Settings, Topology, add_setting_options
from worker.config import redact_url as redact
from worker.dlq.letters import Selection, parse_duration
from worker.dlq.operations import browse, purge, replay
from worker.dlq.render import (
    Progress,
    format_message,
    json_line,
    list_header,
    list_line,
    terminal_safe,
)
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
  2  bad options; purge without --yes when stdin is not a terminal; LTM_RABBITMQ_URL can never work
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
                console.err.write(f"not replayed: {terminal_safe(event_id or '-')}: {terminal_safe(why)}\n")
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


# --- the command line ---------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def _duration(text: str) -> timedelta:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_dlq_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], environment_help: str
) -> None:
    """Add ``worker dlq`` and its actions to the ``worker`` parser (``environment_help`` ends each help)."""
    epilog = EXIT_CODES_HELP + environment_help
    connection = argparse.ArgumentParser(add_help=False)
    add_setting_options(connection, "rabbitmq_url")
    connection.add_argument(
        "--batch",
        type=_positive_int,
        default=DEFAULT_BATCH,
        help=f"messages taken from the DLQ per round (default {DEFAULT_BATCH})",
    )
    filters = argparse.ArgumentParser(add_help=False)
    filters.add_argument(
        "--kind",
        action="append",
        metavar="KIND",
        help=f"only this error kind ({', '.join(DeadLetterKind)}, or a broker reason such as "
        "delivery_limit); repeat or comma-separate for several",
    )
    filters.add_argument(
        "--event-id", action="append", metavar="ID", help="only this event id; repeat for several"
    )
    filters.add_argument(
        "--older-than",
        type=_duration,
        metavar="DURATION",
        help="only dead letters that failed at least this long ago (30s, 10m, 2h, 1d, 1h30m)",
    )

    dlq = commands.add_parser(
        "dlq",
        help="inspect, replay and purge dead letters (ltm.create_memory.dlq)",
        description="Inspect, replay and purge the dead letters in ltm.create_memory.dlq. Every command "
        "reads the queue in one pass, holding each message unacked until it is settled, so a crash loses "
        "nothing: what was not settled returns to the queue.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list",
        parents=[connection, filters],
        help="one line per dead letter",
        description="One line per dead letter: event id, kind, attempts, failed at, shard, age, error. "
        "A count goes to stderr. The queue is left as it was.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    listing.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per line: event_id, kind, error, attempts, failed_at, shard_id, routing_key",
    )
    show = actions.add_parser(
        "show",
        parents=[connection],
        help="print a dead letter in full",
        description="Print every dead letter with this event id in full: properties, headers, body (as JSON "
        "when it parses). The queue is left as it was.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    show.add_argument("event_id", metavar="EVENT_ID")
    replay = actions.add_parser(
        "replay",
        parents=[connection, filters],
        help="send dead letters back to the work exchange (all by default; no prompt: replay is safe)",
        description="Republish the selected dead letters (all by default) to tomori.tool_calls with their "
        "original routing key, body and properties, without the x-ltm-error/-error-kind/-failed-at/-attempts "
        "and x-death headers, with x-ltm-replayed-at and x-ltm-replay-count added. Each DLQ copy is removed "
        "only after the broker confirmed the republished one, so an interrupted replay loses nothing (at "
        "worst an event is in both queues; the worker's idempotency makes that harmless).",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    replay.add_argument("--limit", type=_positive_int, metavar="N", help="move at most N dead letters")
    replay.add_argument("--dry-run", action="store_true", help="list what would move; move nothing")
    replay.add_argument(
        "--progress", action="store_true", help="print progress to stderr even when it is not a terminal"
    )
    purge = actions.add_parser(
        "purge",
        parents=[connection, filters],
        help="delete dead letters for good (asks first unless --yes)",
        description="Delete the selected dead letters (all by default). Scans the whole queue first, then "
        "asks 'Delete N dead letters? [y/N]'; exactly the N counted are deleted. Without a terminal on "
        "stdin, --yes is required.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    purge.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    purge.add_argument(
        "--progress", action="store_true", help="print progress to stderr even when it is not a terminal"
    )


def run_dlq(args: argparse.Namespace, settings: Settings) -> int:
    """``worker dlq ACTION`` as parsed by :func:`add_dlq_parser`: run it, return the exit code."""
    try:
        code = asyncio.run(_dispatch(args, settings))
    except KeyboardInterrupt:  # the sweep's cleanup already requeued what it held
        print("interrupted; dead letters not yet settled stay in the DLQ", file=sys.stderr)
        return EXIT_INTERRUPTED
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # the reader of a pipe left early: nothing more to say, and no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return code


async def _dispatch(args: argparse.Namespace, settings: Settings) -> int:
    # the commands report connection failures themselves, in one line; the client libraries' own error
    # logs (aiormq logs every failed connect) would only repeat them as noise
    for name in ("aiormq", "aio_pika"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    url, topology = settings.rabbitmq_url, settings.topology
    if args.dlq_command == "show":
        return await show_command(url, topology, args.event_id, batch=args.batch)
    kinds = {kind.strip() for value in args.kind or () for kind in value.split(",") if kind.strip()}
    selection = Selection(
        kinds=frozenset(kinds), event_ids=frozenset(args.event_id or ()), older_than=args.older_than
    )
    if args.dlq_command == "list":
        return await list_command(url, topology, selection, batch=args.batch, as_json=args.json)
    if args.dlq_command == "replay":
        return await replay_command(
            url,
            topology,
            selection,
            batch=args.batch,
            limit=args.limit,
            dry_run=args.dry_run,
            progress=args.progress,
        )
    return await purge_command(
        url, topology, selection, yes=args.yes, batch=args.batch, progress=args.progress
    )
