"""Where ``worker dlq``'s commands write, their exit codes, and the one place a failure an operator can act on
becomes a line and an exit code (:func:`guarded`)."""

from __future__ import annotations

import sys
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TextIO

import aiormq.exceptions

from worker.ops.dlq.audit import AuditUnavailable
from worker.ops.dlq.sweep import DlqError, Undeclared
from worker.redact import describe
from worker.redact import redact_url as redact

EXIT_OK = 0  # also when nothing was selected: an empty list, or nothing to replay or purge, is an answer
EXIT_FAILED = 1  # show: not found; replay: some could not be republished; purge: declined; check: disagree
EXIT_USAGE = 2  # bad options; purge without --yes and without a terminal to ask on
EXIT_UNREACHABLE = 3  # RabbitMQ cannot be reached (or the connection died mid-way)
EXIT_MISSING = 4  # the DLQ (or, for replay, the work exchange) does not exist on the vhost
EXIT_AUDIT = 5  # replay, purge: the audit record cannot be written (Postgres); nothing was done without one
EXIT_BUSY = 6  # another operation in the way runs on the DLQ (the message names it); nothing was done
EXIT_INTERRUPTED = 130

EXIT_CODES_HELP = """
exit codes:
  0  done, also when nothing matched (list prints no lines; replay and purge move or delete 0)
  1  show: no such dead letter; replay: some dead letters could not be republished (they stay in the DLQ);
     purge: not confirmed; cancel: no such replay; check: the DLQ and ltm_dead_letters disagree
  2  bad options; purge without --yes when stdin is not a terminal; a connection URL can never work
  3  RabbitMQ cannot be reached (or the connection was lost; nothing is lost with it)
  4  the DLQ (replay: or the work exchange) does not exist on the vhost
  5  replay, purge, expire, repair: the audit record cannot be written to Postgres (nothing taken off the
     queue without it; stopped mid-way when a write fails: the rest stays in the DLQ); history, ui, check:
     Postgres unreadable
  6  replay: another replay of the same DLQ runs (the message says whose, and how to cancel it); expire,
     repair: another operation runs on the DLQ, and any while one of those runs; cancel: the operation did
     not stop within --wait
  130  interrupted (Ctrl-C), or replay: cancelled (`worker dlq cancel`); whatever was not settled stays in the
     DLQ
"""


@dataclass(frozen=True, slots=True)
class Console:
    """Where a command writes, and whether a person is watching."""

    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)


def unavailable(exc: AuditUnavailable, console: Console) -> int:
    """Say why the audit record cannot be opened or read; its exit code."""
    console.err.write(f"{exc}\n")
    return EXIT_AUDIT


async def guarded(work: Awaitable[int], url: str, console: Console) -> int:
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
