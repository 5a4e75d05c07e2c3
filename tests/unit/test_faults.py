"""Which failures the worker retries (transient) and which it dead-letters at once (internal)."""

from __future__ import annotations

import asyncio

import aio_pika.exceptions
import asyncpg
import pytest
import redis.exceptions

from worker.faults import TransientError, is_transient


@pytest.mark.parametrize(
    "exc",
    [
        asyncpg.exceptions.DeadlockDetectedError("deadlock detected"),
        asyncpg.exceptions.SerializationError("could not serialize access"),
        asyncpg.exceptions.LockNotAvailableError("could not obtain lock"),
        asyncpg.exceptions.QueryCanceledError("canceling statement due to statement timeout"),
        asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command"),
        asyncpg.exceptions.CannotConnectNowError("the database system is starting up"),
        asyncpg.exceptions.TooManyConnectionsError("too many clients"),
        asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        asyncpg.exceptions.InterfaceError("connection is closed"),
        ConnectionRefusedError(111, "Connect call failed"),
        TimeoutError(),
        redis.exceptions.ConnectionError("Error 111 connecting"),
        redis.exceptions.TimeoutError("Timeout reading from socket"),
        aio_pika.exceptions.ChannelInvalidStateError("channel closed"),
        TransientError("publish was not delivered"),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_transient_faults_are_retried(exc: BaseException) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        asyncpg.exceptions.RaiseError("forced failure"),
        asyncpg.exceptions.ForeignKeyViolationError("violates foreign key constraint"),
        asyncpg.exceptions.UndefinedTableError("relation does not exist"),
        KeyError("content_saved"),
        ValueError("bad value"),
        AssertionError(),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_bugs_are_not_retried(exc: BaseException) -> None:
    assert not is_transient(exc)


def test_a_bug_raised_while_handling_a_transient_fault_is_transient_by_its_cause() -> None:
    cause = asyncpg.exceptions.DeadlockDetectedError("deadlock detected")
    wrapped = RuntimeError("wrapped")
    wrapped.__cause__ = cause
    assert is_transient(wrapped)


def test_cancellation_is_not_a_fault() -> None:
    assert not is_transient(asyncio.CancelledError())
