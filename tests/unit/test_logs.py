"""Log rendering (tracebacks as text from every logger) and the filter for routine connection losses."""

from __future__ import annotations

import asyncio
import errno
import io
import json
import logging
import os
import ssl
import subprocess
import sys
import textwrap

import aiormq.exceptions
import pytest

from tests.support.harness import REPO
from worker.observability.logs import ExpectedDisconnects, SurvivingStream

LOGGING_SCRIPT = textwrap.dedent(
    """
    import logging, sys
    import structlog
    from worker.observability.logs import configure_logging

    configure_logging(sys.argv[1], "info")
    try:
        raise ValueError("boom from the library")
    except ValueError:
        logging.getLogger("aiormq.connection").error("library failed", exc_info=True)
    try:
        raise KeyError("boom from the worker")
    except KeyError as exc:
        structlog.get_logger("worker").error("internal error; dead-lettered", exc_info=exc)
    """
)


def logged(fmt: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", LOGGING_SCRIPT, fmt],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stderr


def test_json_logs_carry_every_loggers_traceback_as_text() -> None:
    lines = [json.loads(line) for line in logged("json").splitlines()]

    assert [(line["event"], line["level"]) for line in lines] == [
        ("library failed", "error"),
        ("internal error; dead-lettered", "error"),
    ]
    assert lines[0]["logger"] == "aiormq.connection"
    errors = ("ValueError: boom from the library", "KeyError: 'boom from the worker'")
    for line, error in zip(lines, errors, strict=True):
        assert line["exception"].startswith("Traceback (most recent call last):\n"), line
        assert line["exception"].endswith(error), line
        assert "exc_info" not in line
    assert "<traceback object" not in logged("json")


def test_console_logs_print_every_loggers_traceback() -> None:
    text = logged("console")

    assert text.count("Traceback (most recent call last):") == 2, text
    assert "ValueError: boom from the library" in text
    assert "KeyError: 'boom from the worker'" in text
    assert "<traceback object" not in text


def caused(exc: BaseException, cause: BaseException) -> BaseException:
    exc.__cause__ = cause
    return exc


def record(
    logger: str,
    msg: str,
    args: tuple[object, ...] = (),
    *,
    level: int = logging.ERROR,
    exc: BaseException | None = None,
) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord(logger, level, __file__, 1, msg, args, exc_info)


CLOSE = 'Unexpected connection close from remote "%s", Connection.Close(reply_code=%r, reply_text=%r)'
TRANSPORT = "error when creating transport: %r"
READER = "Cancelling cause reader exited abnormally"
ROBUST = "Reconnect attempt failed %s due to %s: %s. Retrying after %r seconds."
REFUSED = caused(
    aiormq.exceptions.AMQPConnectionError(111, "Connection refused"), ConnectionRefusedError(111)
)
EOF_CLOSE = caused(
    aiormq.exceptions.AMQPConnectionError("Server connection unexpectedly closed"),
    asyncio.IncompleteReadError(b"", 1),
)


@pytest.mark.parametrize(
    ("given", "level"),
    [
        (
            record("aiormq.connection", CLOSE, ("amqp://x", 320, "CONNECTION_FORCED - shutdown")),
            logging.WARNING,
        ),
        (record("aiormq.connection", TRANSPORT, (REFUSED,)), logging.DEBUG),
        (record("aiormq.connection", TRANSPORT, (ConnectionRefusedError(111),)), logging.DEBUG),
        # a TLS or name-resolution failure is a configuration problem, but the caller's own line says it
        # (the worker's `rabbitmq unavailable` at ERROR): one line per attempt, not two
        (
            record(
                "aiormq.connection",
                TRANSPORT,
                (
                    caused(
                        aiormq.exceptions.AMQPConnectionError("bad certificate"),
                        ssl.SSLError(1, "bad certificate"),
                    ),
                ),
            ),
            logging.DEBUG,
        ),
        (record("aiormq.connection", TRANSPORT, (OSError(-2, "Name or service not known"),)), logging.DEBUG),
        (record("aiormq.connection", READER, level=logging.WARNING, exc=EOF_CLOSE), logging.DEBUG),
        (
            record(
                "aiormq.connection",
                READER,
                level=logging.WARNING,
                exc=aiormq.exceptions.ConnectionClosed(320, "CONNECTION_FORCED - shutdown"),
            ),
            logging.DEBUG,
        ),
        (
            record("aio_pika.robust_connection", ROBUST, ("amqp://x", "AMQPConnectionError", REFUSED, 5)),
            logging.WARNING,
        ),
    ],
)
def test_a_routine_connection_loss_is_lowered(given: logging.LogRecord, level: int) -> None:
    shown = ExpectedDisconnects(threshold=logging.DEBUG).filter(given)

    assert shown
    assert (given.levelno, given.levelname) == (level, logging.getLevelName(level))


@pytest.mark.parametrize(
    "given",
    [
        # the broker refusing the vhost or the user is a problem, not a restart
        record("aiormq.connection", CLOSE, ("amqp://x", 530, "NOT_ALLOWED - vhost not found")),
        record("aiormq.connection", CLOSE, ("amqp://x", 541, "INTERNAL_ERROR")),
        # a malformed frame is what aiormq's reader warning is there for
        record(
            "aiormq.connection",
            READER,
            level=logging.WARNING,
            exc=aiormq.exceptions.InvalidFrameError(b"\x00"),
        ),
        record("aiormq.channel", "Consumer callback failed", exc=RuntimeError("bug")),
        record("aiormq.connection", "Got frame for closed channel %d: %r", (3, "frame")),
        # someone else's record with the same words is not aiormq's
        record("worker", CLOSE, ("amqp://x", 320, "CONNECTION_FORCED")),
    ],
)
def test_everything_else_keeps_its_level(given: logging.LogRecord) -> None:
    before = given.levelno

    assert ExpectedDisconnects(threshold=logging.WARNING).filter(given)
    assert given.levelno == before


def test_a_record_lowered_below_the_threshold_is_dropped() -> None:
    given = record("aiormq.connection", TRANSPORT, (REFUSED,))

    assert not ExpectedDisconnects(threshold=logging.WARNING).filter(given)


# --- a reader that went away (newcomer review 4, F1) ------------------------------------------------------


def points_at_devnull(fd: int) -> bool:
    found, devnull = os.fstat(fd), os.stat(os.devnull)
    return (found.st_dev, found.st_ino) == (devnull.st_dev, devnull.st_ino)


def test_a_write_into_a_pipe_whose_reader_left_is_dropped_and_later_ones_go_to_devnull() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    stream = SurvivingStream(io.TextIOWrapper(os.fdopen(write_end, "wb"), encoding="utf-8"))
    try:
        assert stream.write("stopping\n") == len("stopping\n")
        stream.flush()  # EPIPE here: swallowed, and the descriptor now leads to /dev/null

        assert points_at_devnull(write_end)
        stream.write("stopped cleanly\n")
        stream.flush()
    finally:
        stream.close()


class FullDisk(io.StringIO):
    """A stream whose writes fail until ``free`` (a log file on a full disk)."""

    full = True

    def write(self, text: str) -> int:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(text)


def test_another_write_failure_drops_only_that_line() -> None:
    disk = FullDisk()
    stream = SurvivingStream(disk)

    stream.write("lost\n")
    disk.full = False
    stream.write("kept\n")

    assert disk.getvalue() == "kept\n"


def test_every_log_line_goes_through_the_guarded_stream_and_none_raises() -> None:
    script = textwrap.dedent(
        """
        import os, sys
        import structlog
        from worker.observability.logs import configure_logging, guard_std_streams

        guard_std_streams()
        configure_logging("json", "info")
        os.close(int(sys.argv[1]))  # the only reader leaves
        for n in range(3):
            structlog.get_logger("worker").info("after the reader left", n=n)
        print("printed too")
        import logging
        logging.getLogger("aiormq.connection").error("a library line")
        sys.exit(7)
        """
    )
    read_end, write_end = os.pipe()
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(read_end)],
        cwd=REPO,
        stdout=write_end,
        stderr=write_end,
        pass_fds=(read_end,),
    )
    os.close(write_end)
    os.close(read_end)  # the child holds the last read end, and closes it itself

    assert child.wait(timeout=60) == 7  # its own exit code: no traceback, no 120 for a failed flush at exit
