"""``worker dlq``'s commands: each connects, runs one operation, prints, and returns the exit code."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TextIO

import aiormq.exceptions
import orjson

from worker.broker.urls import vhost_of
from worker.config import Topology
from worker.ops.dlq.audit import Audit, AuditUnavailable, Operation
from worker.ops.dlq.groups import Grouping, group_header, group_json_line, group_line
from worker.ops.dlq.letters import Selection
from worker.ops.dlq.operations import StopFn, Totals, browse, purge, replay
from worker.ops.dlq.render import (
    Progress,
    format_message,
    json_line,
    list_header,
    list_line,
    terminal_safe,
)
from worker.ops.dlq.sweep import DEFAULT_BATCH, DlqError, Found, Undeclared, open_dead_letters
from worker.redact import describe
from worker.redact import redact_url as redact

EXIT_OK = 0  # also when nothing was selected: an empty list, or nothing to replay or purge, is an answer
EXIT_FAILED = 1  # show: not found; replay: some could not be republished; purge: declined
EXIT_USAGE = 2  # bad options; purge without --yes and without a terminal to ask on
EXIT_UNREACHABLE = 3  # RabbitMQ cannot be reached (or the connection died mid-way)
EXIT_MISSING = 4  # the DLQ (or, for replay, the work exchange) does not exist on the vhost
EXIT_AUDIT = 5  # replay, purge: the audit record cannot be written (Postgres); nothing was done without one
EXIT_INTERRUPTED = 130

EXIT_CODES_HELP = """
exit codes:
  0  done, also when nothing matched (list prints no lines; replay and purge move or delete 0)
  1  show: no such dead letter; replay: some dead letters could not be republished (they stay in the DLQ);
     purge: not confirmed
  2  bad options; purge without --yes when stdin is not a terminal; a connection URL can never work
  3  RabbitMQ cannot be reached (or the connection was lost; nothing is lost with it)
  4  the DLQ (replay: or the work exchange) does not exist on the vhost
  5  replay, purge: the audit record cannot be written to Postgres (nothing taken off the queue without it;
     stopped mid-way when a write fails: the rest stays in the DLQ); history, ui: Postgres unreadable
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
    group_by: str | None = None,
    console: Console | None = None,
) -> int:
    console = console or Console()
    if group_by is not None:
        return await _guarded(
            _list_groups(url, topology, selection, group_by, batch, as_json, console), url, console
        )

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


async def _list_groups(
    url: str,
    topology: Topology,
    selection: Selection,
    group_by: str,
    batch: int,
    as_json: bool,
    console: Console,
) -> int:
    """``list --group-by``: one line per group, largest first."""
    async with open_dead_letters(url, topology) as dlq:
        grouping = Grouping(group_by)
        totals = await browse(dlq, selection, lambda found, _now: grouping.add(found.letter), batch=batch)
        groups = grouping.groups
        if groups and not as_json:
            console.out.write(group_header() + "\n")
        for group in groups:
            console.out.write((group_json_line(group) if as_json else group_line(group)) + "\n")
        console.out.flush()
        console.err.write(
            f"{totals.selected} of {totals.scanned} dead letters in {dlq.name}, "
            f"{len(groups)} group(s) by {group_by}\n"
        )
    return EXIT_OK


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
    audit: Audited | None = None,
    console: Console | None = None,
    stop: StopFn | None = None,
) -> int:
    """``audit``: where the operation is recorded (the CLI always gives one; a dry run records nothing);
    ``stop``: whether Ctrl-C was pressed (the CLI's :class:`Interruption`), asked between batches."""
    console = console or Console()
    journal: Operation | None = None
    outcome: Totals | None = None

    async def run() -> int:
        nonlocal outcome
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
                    journal=journal,
                    stop=stop,
                )
            finally:
                if meter is not None:
                    meter.finish()
            outcome = totals
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

    if dry_run or audit is None:
        return await _guarded(run(), url, console)
    recorder = _Recorder(console)
    try:
        journal = await audit.start("replay", selection, url, topology, limit=limit)
    except AuditUnavailable as exc:
        console.err.write(f"refusing to replay: {exc}; nothing was replayed\n")
        return EXIT_AUDIT
    try:
        code = await audit.run(journal, _guarded(run(), url, recorder.console), stop=stop)
        failed = 0 if outcome is None else len(outcome.failures)
        note = f"{failed} not replayed" if failed else None
        return await audit.finish(journal, code, recorder, outcome, note)
    finally:
        await audit.close()


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
    journal: Operation | None = None
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

    async def run() -> int:
        nonlocal outcome
        async with open_dead_letters(url, topology) as dlq:
            try:
                totals = await purge(
                    dlq,
                    selection,
                    batch=batch,
                    confirm=None if yes else confirm,
                    progress=meter,
                    journal=journal,
                    stop=stop,
                )
            finally:
                if meter is not None:
                    meter.finish()
            outcome = totals
            if declined:
                console.out.write(f"nothing deleted, kept {totals.kept}\n")
                return EXIT_FAILED
            console.out.write(f"deleted {totals.removed}, kept {totals.kept}\n")
        return EXIT_OK

    if audit is None:
        return await _guarded(run(), url, console)
    recorder = _Recorder(console)
    try:
        journal = await audit.start("purge", selection, url, topology)
    except AuditUnavailable as exc:
        console.err.write(f"refusing to purge: {exc}; nothing was deleted\n")
        return EXIT_AUDIT
    try:
        code = await audit.run(journal, _guarded(run(), url, recorder.console), stop=stop)
        if declined:
            return await audit.finish(journal, code, recorder, outcome, "not confirmed", state="refused")
        return await audit.finish(journal, code, recorder, outcome, None)
    finally:
        await audit.close()


class _Recorder:
    """The command's console, remembering its last error line (what the audit says went wrong)."""

    def __init__(self, console: Console) -> None:
        self.last_error: str | None = None
        recorder = self

        class Err:
            def write(self, text: str) -> int:
                if text.strip():
                    recorder.last_error = text.strip().splitlines()[-1]
                return console.err.write(text)

            def flush(self) -> None:
                console.err.flush()

            def isatty(self) -> bool:
                return console.err.isatty()

        self.console = Console(out=console.out, err=Err())  # type: ignore[arg-type]


@dataclass
class Audited:
    """How the CLI records a replay or purge: the audit database and who runs it."""

    dsn: str
    actor: str
    _audit: Audit | None = None

    async def start(
        self, action: str, selection: Selection, url: str, topology: Topology, *, limit: int | None = None
    ) -> Operation:
        """Connect and write the operation's row; :class:`AuditUnavailable` when either fails."""
        self._audit = await Audit.open(self.dsn)
        filters = selection.describe()
        if limit is not None:
            filters["limit"] = limit
        try:
            return await self._audit.start(
                action, self.actor, filters, vhost=vhost_of(url), queue=topology.dead_letter_queue
            )
        except AuditUnavailable:
            await self.close()
            raise

    async def run(self, operation: Operation, work: Awaitable[int], *, stop: StopFn | None = None) -> int:
        """Run the operation; an interruption (Ctrl-C) is put on record before it goes on. ``stop`` says
        whether Ctrl-C was pressed: an operation that ended all the same (the cancellation was lost on the
        way and the signal came after its last batch was taken) is interrupted too, on record and by exit
        code, never 'done' with exit 0."""
        try:
            code = await work
            if stop is not None and stop():
                raise asyncio.CancelledError("interrupted")
            return code
        except (asyncio.CancelledError, KeyboardInterrupt):
            with contextlib.suppress(Exception):
                await asyncio.shield(operation.finish("interrupted", "interrupted (Ctrl-C)"))
            raise

    async def finish(
        self,
        operation: Operation,
        code: int,
        recorder: _Recorder,
        totals: Totals | None,
        note: str | None,
        *,
        state: str | None = None,
    ) -> int:
        """Close the record by the exit code; a record that cannot be closed is said (the letters' rows
        are written already, so nothing is missing: the operation just stays 'started')."""
        if state is None:
            state = "done" if code in (EXIT_OK, EXIT_FAILED) else "failed"
        detail = note if state in ("done", "refused") else recorder.last_error
        if code == EXIT_AUDIT:
            detail = recorder.last_error
        try:
            await operation.finish(
                state,
                detail,
                expected=None if totals is None else totals.expected,
                scanned=None if totals is None else totals.scanned,
            )
        except AuditUnavailable as exc:
            recorder.console.err.write(f"the audit record {operation.id} stays 'started': {exc}\n")
            return EXIT_AUDIT if code == EXIT_OK else code
        return code

    async def refusal(
        self, action: str, selection: Selection, url: str, topology: Topology, why: str, console: Console
    ) -> None:
        """Record an operation refused before it began (best effort: the refusal already stands)."""
        try:
            operation = await self.start(action, selection, url, topology)
            try:
                await operation.finish("refused", why)
            finally:
                await self.close()
        except AuditUnavailable as exc:
            console.err.write(f"the refusal could not be recorded: {exc}\n")

    async def close(self) -> None:
        if self._audit is not None:
            await self._audit.close()
            self._audit = None


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
    except AuditUnavailable as exc:  # a write mid-way failed: stopped; what was held is back in the queue
        console.err.write(f"stopped: {exc}; the dead letters not yet recorded stay in the DLQ\n")
        return EXIT_AUDIT
    except DlqError as exc:
        console.err.write(f"{exc}\n")
        return EXIT_MISSING if isinstance(exc, Undeclared) else EXIT_UNREACHABLE
    except BrokenPipeError:  # `worker dlq list | head`: the reader has seen enough; the sweep requeued all
        return EXIT_OK
    except (OSError, TimeoutError, aiormq.exceptions.AMQPError) as exc:
        console.err.write(
            f"lost the connection to RabbitMQ at {redact(url)}: {describe(exc)} "
            "(dead letters not yet settled stay in the queue)\n"
        )
        return EXIT_UNREACHABLE


# --- the command line ---------------------------------------------------------------------------------


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
