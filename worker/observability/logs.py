"""structlog set-up: one JSON object per line when not on a terminal, readable columns on one.

The standard library's loggers (aiormq, aio-pika, asyncpg, redis) print through the same renderer, with
their tracebacks as text, and :class:`ExpectedDisconnects` keeps their chatter about a routine connection
loss (a broker restart, an operator closing a connection) out of ERROR.

Output never stops a command: :func:`guard_std_streams` makes every write to stdout and stderr (log lines,
``print``) one that cannot raise, so a reader that went away (``worker run | head``, a log shipper that
restarts, a closed terminal) cannot break a signal handler, a shutdown or a sweep half-way.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import sys
from collections.abc import Iterable
from typing import IO, Any, TextIO, cast

import aiormq.exceptions
import structlog

from worker.config import Settings, expected_value, refused_settings

#: AMQP reply code of a connection the broker closes on purpose: shutdown, restart, maintenance mode, or an
#: operator's ``rabbitmqctl close_connection``
CONNECTION_FORCED = 320
#: a socket refused, reset, timed out, or closed by the peer (EOF)
_SOCKET_LOSS = (ConnectionError, TimeoutError, asyncio.IncompleteReadError)


def is_connection_loss(exc: object) -> bool:
    """True for an exception that says the peer went away or is not there, not that something is broken.

    A refused, reset or timed-out socket, an EOF, or a broker's forced close (320). Other AMQP closes
    (access refused, vhost missing, frame errors), TLS and name-resolution failures are problems someone
    must look at, so they are not.
    """
    if isinstance(exc, aiormq.exceptions.ConnectionClosed):
        return exc.args[:1] == (CONNECTION_FORCED,)
    if isinstance(exc, aiormq.exceptions.AMQPError):
        # aiormq wraps the socket's error (a refused connect, an EOF, but also TLS and DNS failures) in
        # AMQPConnectionError: judge the cause
        return isinstance(exc.__cause__, _SOCKET_LOSS)
    return isinstance(exc, _SOCKET_LOSS)


class ExpectedDisconnects(logging.Filter):
    """Lower the client libraries' records about an expected connection loss; leave everything else.

    A routine broker restart makes aiormq log an ERROR for the broker's close and one per refused
    reconnect, so an alert on ERROR would fire for a planned restart. The worker's own log already says
    what happened, at WARNING (``rabbitmq connection lost; reconnecting``, ``rabbitmq unavailable``). Only
    these records change, and (but for the first) only when their exception is a connection loss
    (:func:`is_connection_loss`):

    - aiormq ``error when creating transport``, whatever the cause: DEBUG. Every caller says it in a line of
      its own naming the node (``rabbitmq unavailable``, at ERROR for a TLS or name-resolution failure;
      ``worker check``; ``worker dlq``'s ``cannot reach RabbitMQ``), so one failed connect is one line;
    - aiormq ``Unexpected connection close from remote`` with reply code 320: WARNING (it carries the
      broker's reason, which the worker's line does not);
    - aiormq ``Cancelling cause reader exited abnormally`` (a WARNING with the reader task's traceback):
      DEBUG (the worker's ``rabbitmq connection lost`` says it; the traceback is always the same frames);
    - aio-pika ``Reconnect attempt failed`` (robust connections): WARNING.

    The messages are matched on their templates: should a library reword one, its record stays at its own
    level (tests/e2e/test_logs.py notices). Records that end below ``threshold`` are dropped, as the
    logger's level would have dropped them had they been logged there.
    """

    def __init__(self, threshold: int) -> None:
        super().__init__()
        self.threshold = threshold

    def filter(self, record: logging.LogRecord) -> bool:
        level = self._lowered(record)
        if level is None or level >= record.levelno:
            return True
        record.levelno, record.levelname = level, logging.getLevelName(level)
        return level >= self.threshold

    @staticmethod
    def _lowered(record: logging.LogRecord) -> int | None:
        """The level ``record`` should have, or None to leave it as it is."""
        if not record.name.startswith(("aiormq", "aio_pika")):
            return None
        template, args = str(record.msg), record.args if isinstance(record.args, tuple) else ()
        if template.startswith("Unexpected connection close from remote"):
            return logging.WARNING if args[1:2] == (CONNECTION_FORCED,) else None
        if template.startswith("error when creating transport"):
            # a failed connect, whatever the cause: the caller's own line says it once, naming the node
            # (`rabbitmq unavailable`, `worker check`'s FAIL, `worker dlq`'s `cannot reach RabbitMQ`)
            return logging.DEBUG
        if template.startswith("Cancelling cause reader exited abnormally"):
            exc = record.exc_info[1] if record.exc_info else None
            return logging.DEBUG if is_connection_loss(exc) else None
        if template.startswith("Reconnect attempt failed"):
            return logging.WARNING if len(args) > 2 and is_connection_loss(args[2]) else None
        return None


class SurvivingStream:
    """A text stream (stdout, stderr) whose writes never raise.

    A write or flush that fails is dropped: the line is lost, the program goes on. When the reader has
    gone for good (``EPIPE``: the other end of a pipe closed), the stream's file descriptor is pointed at
    ``/dev/null``, as CPython's documentation advises for SIGPIPE, so what is still buffered and every
    later line (the interpreter's own at exit included) goes nowhere instead of failing again. Any other
    failure (a full disk, a hung-up terminal) drops only that line: the next one is tried again.
    """

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError as exc:
            self._failed(exc)
            return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as exc:
            self._failed(exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

    def _failed(self, exc: OSError) -> None:
        if exc.errno != errno.EPIPE:
            return
        try:
            fd = self.stream.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
        except (OSError, ValueError):  # no descriptor of its own (a test's capture): drop, as above
            return
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)
        with contextlib.suppress(OSError):  # what the failed write left in the buffer goes to /dev/null now
            self.stream.flush()


def guard_std_streams() -> None:
    """Wrap ``sys.stdout`` and ``sys.stderr`` in :class:`SurvivingStream` (once); every command's first
    step, before anything is logged or printed."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, SurvivingStream):
            setattr(sys, name, cast(TextIO, SurvivingStream(stream)))


def log_setting_warnings(settings: Settings) -> None:
    """A warning per setting that fell back to its default (``Settings.fallbacks``), saying what it takes,
    then one per note (``Settings.notes``: a value read other than as written, a DSN without ``sslmode``, an
    unknown ``LTM_*`` variable), each with its ``variable`` and the sentence (``note``)."""
    log = structlog.get_logger("worker")
    refused = refused_settings(settings)  # not a fallback: the command stops on it, and says so itself
    for var, raw, default in settings.fallbacks:
        if var in refused:
            continue
        log.warning(
            "invalid setting, using the default",
            variable=var,
            value=raw,
            default=default,
            expected=expected_value(var),
        )
    for var, note in settings.notes:
        log.warning("setting not taken as written", variable=var, note=note)


def configure_logging(fmt: str = "auto", level: str = "info") -> None:
    """Configure structlog and the standard library's logging (aio-pika, asyncpg) to print through it.

    ``fmt`` is ``json``, ``console`` or ``auto`` (console on a terminal, JSON elsewhere). An exception
    renders as text either way: in JSON, an ``exception`` field with the traceback.
    """
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor = (
        structlog.dev.ConsoleRenderer(colors=True) if use_console else structlog.processors.JSONRenderer()
    )
    # the console renderer formats exc_info itself; JSON needs it turned into text first, or it prints the
    # traceback object's repr
    exceptions: structlog.types.Processor = (
        structlog.dev.set_exc_info if use_console else structlog.processors.format_exc_info
    )
    structlog.configure(
        processors=[*shared, structlog.processors.StackInfoRenderer(), exceptions, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # library chatter (aio-pika reconnect traces, asyncpg notices) only from warnings up
    library_level = max(numeric, logging.WARNING)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[
                *shared,
                structlog.stdlib.add_logger_name,
                *(() if use_console else (structlog.processors.format_exc_info,)),
            ],
        )
    )
    handler.addFilter(ExpectedDisconnects(library_level))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(library_level)
