"""``worker dlq``'s command line: its parser (``add_dlq_parser``, from :mod:`worker.ops.dlq.options`), what
each action runs (a table), one command's run (``run_dlq``), and what a Ctrl-C does to it
(:class:`Interruption`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from worker.config import Settings
from worker.ops.dlq.agreement import check_command, repair_command
from worker.ops.dlq.audit import Operation, default_actor
from worker.ops.dlq.audited import Audited
from worker.ops.dlq.commands import purge_command, replay_command
from worker.ops.dlq.console import EXIT_INTERRUPTED
from worker.ops.dlq.history import history_command
from worker.ops.dlq.listing import list_command, show_command
from worker.ops.dlq.live import cancel_command, operations_command
from worker.ops.dlq.operations import StopFn
from worker.ops.dlq.options import DLQ, epilog
from worker.ops.dlq.replaying import Senders
from worker.ops.dlq.retention import expire_command
from worker.ops.dlq.selection import Selection
from worker.ops.subcommands import AddSettings, add_command
from worker.service.identity import IdentityRule


def add_dlq_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], add_options: AddSettings
) -> None:
    """Add ``worker dlq`` and its actions to the ``worker`` parser; ``add_options`` adds the options of the
    settings named (worker/cli.py ``add_setting_options``)."""
    add_command(commands, DLQ, add_options, epilog)


def run_dlq(args: argparse.Namespace, settings: Settings) -> int:
    """``worker dlq ACTION`` as parsed by :func:`add_dlq_parser`: run it, return the exit code."""
    interruption = Interruption(graceful=args.dlq_command == "replay")
    try:
        code = asyncio.run(interruption.run(lambda stop: _dispatch(args, settings, stop)))
    except KeyboardInterrupt:  # Ctrl-C before the command began, or a second one
        code = EXIT_INTERRUPTED
        if interruption.audited is not None and interruption.audited.operation is not None:
            print(_in_doubt(interruption.audited.operation), file=sys.stderr)
            return EXIT_INTERRUPTED
    if code == EXIT_INTERRUPTED and interruption.requested:  # the sweep's cleanup requeued what it held
        print("interrupted; dead letters not yet settled stay in the DLQ", file=sys.stderr)
        return EXIT_INTERRUPTED
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # the reader of a pipe left early: nothing more to say, and no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return code


def _in_doubt(operation: Operation) -> str:
    """What a second Ctrl-C says of the replay it stopped at once."""
    pending = operation.outcomes.get("pending", 0)
    return (
        f"stopped at once: {pending} dead letter(s) in doubt (sent, their originals maybe still in the DLQ); "
        f"`worker dlq history --operation {operation.id}` lists them as pending, and running the same replay "
        "again finishes it without sending a letter twice"
        if pending
        else "stopped at once, between rounds: no dead letter in doubt; what was not settled stays in the DLQ"
    )


class Interruption:
    """Ctrl-C while a command runs: never lost, whatever the command awaits.

    ``asyncio.run`` turns SIGINT into a cancellation of its task, and that cancellation can be lost on the
    way: cancelling a task cancels what it awaits, and a task awaited may swallow its cancellation and
    return normally. aiormq runs each RPC (every ``basic.get`` of a sweep) in a task of its own and times
    its steps with ``asyncio.wait_for``, which on Python 3.11 returns the result instead of raising when the
    cancellation comes as the step completes; a Ctrl-C landing there was lost, and the replay ran to the
    end and exited 0. So SIGINT is taken here (``loop.add_signal_handler``: a flag, always set) and both
    cancels the command and is asked (``stop``) between batches by replay and purge and at the end of the
    operation: the operation stops at the next batch at the latest, is recorded ``interrupted``, and the
    command exits 130. A second Ctrl-C stops at once (KeyboardInterrupt), as ``asyncio.run`` does. SIGINT
    ignored by the parent (a background job of a script) stays ignored.

    ``graceful`` (a replay): the first Ctrl-C only sets the flag, and the replay stops at the end of the round
    in flight (its copies confirmed and its originals removed), so no letter is left both replayed and in the
    DLQ; the second stops at once, and :func:`run_dlq` says how many letters that left in doubt (``audited``:
    the replay's record, which counts them).
    """

    def __init__(self, *, graceful: bool = False) -> None:
        self.requested = False
        self.graceful = graceful
        self.audited: Audited | None = None
        self._task: asyncio.Task[int] | None = None

    def __call__(self) -> bool:
        """Whether Ctrl-C was pressed (the ``stop`` replay and purge ask)."""
        return self.requested

    def interrupt(self) -> None:
        """What SIGINT does: the first one cancels the command, a second one stops at once."""
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if self.graceful:
            sys.stderr.write(
                "\nstopping once the letters in flight are settled; Ctrl-C again stops at once\n"
            )
            return
        if self._task is not None:
            self._task.cancel()

    async def run(self, command: Callable[[StopFn], Coroutine[Any, Any, int]]) -> int:
        """Run ``command(stop)`` with SIGINT taken; its exit code, or 130 once interrupted."""
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(command(self))
        taken = _take_sigint(loop, self.interrupt)
        try:
            code = await self._task
        except asyncio.CancelledError:
            if not self.requested or not self._task.cancelled():
                raise  # not ours: this task itself is being cancelled
            return EXIT_INTERRUPTED
        finally:
            if taken:
                loop.remove_signal_handler(signal.SIGINT)  # back to Python's KeyboardInterrupt
        return EXIT_INTERRUPTED if self.requested else code


def _take_sigint(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> bool:
    """Handle SIGINT on the loop; False when it is ignored or left to the default action, or signals cannot
    be handled here (not the main thread)."""
    if not callable(signal.getsignal(signal.SIGINT)):
        return False
    try:
        loop.add_signal_handler(signal.SIGINT, callback)
    except (ValueError, RuntimeError, NotImplementedError):
        return False
    return True


async def _dispatch(args: argparse.Namespace, settings: Settings, stop: StopFn | None = None) -> int:
    # the commands report connection failures themselves, in one line; the client libraries' own error
    # logs (aiormq logs every failed connect) would only repeat them as noise
    for name in ("aiormq", "aio_pika"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    return await _RUNS[args.dlq_command](args, settings, stop)


def _selection(args: argparse.Namespace) -> Selection:
    kinds = {kind.strip() for value in args.kind or () for kind in value.split(",") if kind.strip()}
    return Selection(
        kinds=frozenset(kinds),
        event_ids=frozenset(args.event_id or ()),
        older_than=args.older_than,
        groups=frozenset(args.group or ()),
        shards=frozenset(args.shard or ()),
        guilds=frozenset(args.guild or ()),
        error=args.error,
        since=args.since,
        until=args.until,
    )


def _audited(args: argparse.Namespace, settings: Settings) -> Audited:
    return Audited(settings.postgres_dsn, args.by or default_actor())


async def _list(args: argparse.Namespace, settings: Settings, _stop: StopFn | None) -> int:
    return await list_command(
        settings.rabbitmq_url, settings.topology, _selection(args), batch=args.batch, as_json=args.json,
        group_by=args.group_by, dsn=None if args.from_queue else settings.postgres_dsn,
    )  # fmt: skip


def _trusted(settings: Settings) -> frozenset[str]:
    """LTM_TRUSTED_PUBLISHERS, as the workers read it: whose record of a letter's sender counts."""
    return IdentityRule.of(settings).trusted


async def _show(args: argparse.Namespace, settings: Settings, _stop: StopFn | None) -> int:
    return await show_command(
        settings.rabbitmq_url, settings.topology, args.event_id, batch=args.batch, trusted=_trusted(settings),
        dsn=None if args.from_queue else settings.postgres_dsn,
    )  # fmt: skip


async def _replay(args: argparse.Namespace, settings: Settings, stop: StopFn | None) -> int:
    senders = Senders(
        refuse_unknown=settings.shard_identity == "required", as_trusted_publisher=args.as_trusted_publisher
    )
    audited = _audited(args, settings)
    if isinstance(stop, Interruption):  # a second Ctrl-C names the letters in doubt from this record
        stop.audited = audited
    return await replay_command(
        settings.rabbitmq_url, settings.topology, _selection(args), batch=args.batch, limit=args.limit,
        dry_run=args.dry_run, progress=args.progress, audit=audited, stop=stop,
        trusted=_trusted(settings), senders=senders, rate=args.rate or None,
    )  # fmt: skip


async def _operations(args: argparse.Namespace, settings: Settings, _stop: StopFn | None) -> int:
    return await operations_command(settings.postgres_dsn, as_json=args.json)


async def _cancel(args: argparse.Namespace, settings: Settings, _stop: StopFn | None) -> int:
    return await cancel_command(
        settings.postgres_dsn, args.operation_id, actor=args.by or default_actor(), wait=args.wait
    )


async def _purge(args: argparse.Namespace, settings: Settings, stop: StopFn | None) -> int:
    return await purge_command(
        settings.rabbitmq_url, settings.topology, _selection(args), yes=args.yes, batch=args.batch,
        progress=args.progress, audit=_audited(args, settings), stop=stop,
    )  # fmt: skip


async def _expire(args: argparse.Namespace, settings: Settings, stop: StopFn | None) -> int:
    return await expire_command(
        settings.rabbitmq_url, settings.topology, settings.dlq_retention, audit=_audited(args, settings),
        batch=args.batch, progress=args.progress, stop=stop,
    )  # fmt: skip


async def _check(args: argparse.Namespace, settings: Settings, _stop: StopFn | None) -> int:
    return await check_command(
        settings.rabbitmq_url, settings.postgres_dsn, settings.topology, batch=args.batch, as_json=args.json,
        trusted=_trusted(settings),
    )  # fmt: skip


async def _repair(args: argparse.Namespace, settings: Settings, _stop: StopFn | None) -> int:
    return await repair_command(
        settings.rabbitmq_url, settings.topology, audit=_audited(args, settings), batch=args.batch,
        trusted=_trusted(settings),
    )  # fmt: skip


async def _history(args: argparse.Namespace, settings: Settings, _stop: StopFn | None) -> int:
    return await history_command(
        settings.postgres_dsn, url=settings.rabbitmq_url, topology=settings.topology, as_json=args.json,
        limit=args.limit, operation=args.operation,
    )  # fmt: skip


async def _ui(args: argparse.Namespace, settings: Settings, _stop: StopFn | None) -> int:
    from worker.ops.dlq.page.command import ui_command  # the page's modules load only for the page

    return await ui_command(
        settings.rabbitmq_url, settings.postgres_dsn, settings.topology, host=args.host, port=args.port,
        token=args.token, token_file=args.token_file, allow_hosts=args.allow_host, batch=args.batch,
        trusted=_trusted(settings), actor=args.by or default_actor(),
    )  # fmt: skip


#: what each action of :data:`~worker.ops.dlq.options.DLQ` runs
_RUNS: dict[str, Callable[[argparse.Namespace, Settings, StopFn | None], Awaitable[int]]] = {
    "list": _list,
    "show": _show,
    "replay": _replay,
    "purge": _purge,
    "expire": _expire,
    "check": _check,
    "repair": _repair,
    "history": _history,
    "operations": _operations,
    "cancel": _cancel,
    "ui": _ui,
}
