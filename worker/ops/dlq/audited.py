"""How the commands put a replay or purge on record (:class:`Audited`): start it before anything moves, record
an interruption, close it by the exit code (the rows are :mod:`worker.ops.dlq.audit`'s)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from worker.broker.urls import vhost_of
from worker.config import Topology
from worker.ops.dlq.audit import Audit, AuditUnavailable, Operation
from worker.ops.dlq.console import EXIT_AUDIT, EXIT_BUSY, EXIT_FAILED, EXIT_OK, Console, guarded
from worker.ops.dlq.operations import StopFn, Totals
from worker.ops.dlq.running import Busy, Heartbeat, begin
from worker.ops.dlq.selection import Selection

#: what an operation does to a letter, as "nothing was ..." says it
_DONE = {"replay": "replayed", "purge": "deleted", "expire": "expired", "repair": "repaired"}
#: how an operation ended, as :meth:`Audited.perform` records it: its totals, a note, a state (None: by the
#: exit code)
Ending = tuple[Totals | None, str | None, str | None]


class Recorder:
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
    #: the operation on record while it runs (what a second Ctrl-C says is in doubt)
    operation: Operation | None = None

    async def start(
        self,
        action: str,
        selection: Selection,
        url: str,
        topology: Topology,
        *,
        limit: int | None = None,
        options: Mapping[str, object] | None = None,
        rate: float | None = None,
    ) -> Operation:
        """Connect and write the operation's row (running.py ``begin``); :class:`AuditUnavailable` when
        either fails, :class:`Busy` when another replay of the DLQ runs. ``options``: what the operator chose
        besides the selection (``as_trusted_publisher``), kept with the filters; ``rate``: letters a second
        (None: as fast as the broker confirms)."""
        self._audit = await Audit.open(self.dsn)
        filters = selection.describe()
        if limit is not None:
            filters["limit"] = limit
        filters.update(options or {})
        try:
            where = {"vhost": vhost_of(url), "queue": topology.dead_letter_queue}
            self.operation = await begin(self._audit, action, self.actor, filters, rate=rate, **where)
            return self.operation
        except (AuditUnavailable, Busy):
            await self.close()
            raise

    async def perform(
        self,
        action: str,
        where: tuple[Selection, str, Topology],
        console: Console,
        work: Callable[[Operation], Awaitable[int]],
        ending: Callable[[], Ending],
        *,
        limit: int | None = None,
        stop: StopFn | None = None,
        options: Mapping[str, object] | None = None,
        rate: float | None = None,
    ) -> int:
        """Run ``work(operation)`` on record, its heartbeat written while it runs: refused (exit 5) when the
        record cannot be started, (exit 6) when another replay of the DLQ runs; an interruption put on
        record, the record closed by the exit code; ``where``: the selection, the broker's URL and the
        topology; ``ending()``: the totals, a note and a state, once it has run; ``options``, ``rate``: as
        for :meth:`start`."""
        selection, url, topology = where
        recorder = Recorder(console)
        try:
            operation = await self.start(
                action, selection, url, topology, limit=limit, options=options, rate=rate
            )
        except AuditUnavailable as exc:
            console.err.write(f"refusing to {action}: {exc}; nothing was {_DONE[action]}\n")
            return EXIT_AUDIT
        except Busy as exc:
            console.err.write(f"refusing to {action}: {exc}; nothing was {_DONE[action]}\n")
            return EXIT_BUSY
        try:
            async with Heartbeat(operation):
                code = await self.run(operation, guarded(work(operation), url, recorder.console), stop=stop)
            totals, note, state = ending()
            return await self.finish(operation, code, recorder, totals, note, state=state)
        finally:
            await self.close()

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
        recorder: Recorder,
        totals: Totals | None,
        note: str | None,
        *,
        state: str | None = None,
    ) -> int:
        """Close the record by the exit code; a record that cannot be closed is said (the letters' rows
        are written already, so nothing is missing: the operation just stays 'started')."""
        if state is None:
            state = "done" if code in (EXIT_OK, EXIT_FAILED) else "failed"
        detail = note if state in ("done", "refused", "cancelled") else recorder.last_error
        if code == EXIT_AUDIT:
            detail = recorder.last_error
        if totals is not None:
            operation.note(totals.expected, totals.scanned, totals.selected, totals.removed)
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
