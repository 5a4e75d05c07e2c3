"""Which failures the worker retries (transient) and which it dead-letters at once (internal)."""

from __future__ import annotations

import asyncio
import ssl

import aio_pika.exceptions
import aiormq.exceptions
import asyncpg
import pytest
import redis.exceptions

from worker.faults import TransientError, is_certificate_problem, is_transient
from worker.redact import certificate_failure, describe
from worker.store.pool import describe_failure


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


def _refused(message: str = "unable to get local issuer certificate") -> ssl.SSLCertVerificationError:
    exc = ssl.SSLCertVerificationError(
        1, f"[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: {message} (_ssl.c:1006)"
    )
    exc.verify_message = message
    return exc


def _wrapped(outer: BaseException, cause: BaseException) -> BaseException:
    try:
        raise outer from cause
    except BaseException as exc:
        return exc


@pytest.mark.parametrize(
    "exc",
    [
        _refused(),  # asyncpg raises it as it is
        _wrapped(aiormq.exceptions.AMQPConnectionError(*_refused().args), _refused()),  # aio-pika
        _wrapped(redis.exceptions.ConnectionError("Error 1 connecting to 127.0.0.1:6380."), _refused()),
    ],
    ids=["postgres", "rabbitmq", "redis"],
)
def test_a_refused_certificate_reads_the_same_whichever_library_raised_it(exc: BaseException) -> None:
    described = describe(exc)
    assert described.startswith("TLS certificate not accepted (unable to get local issuer certificate): ")
    assert is_certificate_problem(described)
    assert certificate_failure(exc) is not None
    assert is_transient(exc)  # retried like any other dependency failure
    assert "CERTIFICATE_VERIFY_FAILED" in described


def test_a_refused_certificate_is_not_an_invalid_connection_string() -> None:
    """SSLCertVerificationError is a ValueError, as asyncpg's configuration errors are; only the latter
    mean a DSN that can never work."""
    assert describe_failure(_refused()).startswith("TLS certificate not accepted")
    assert describe_failure(ValueError("`sslmode` parameter must be one of ...")).startswith(
        "invalid connection string: "
    )
    assert not is_certificate_problem(describe(ConnectionRefusedError(111, "Connect call failed")))
    assert certificate_failure(ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")) is None
