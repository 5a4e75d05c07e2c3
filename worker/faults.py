"""Which failures are worth another try.

A transient fault is one the same event may survive on a later attempt: a dependency unreachable or
restarting, a connection cut, a deadlock, a serialization failure, a lock or statement timeout, a
publish the broker did not confirm. Anything else is a bug (``internal``) and is not retried.
"""

from __future__ import annotations

import asyncio
import socket
import ssl

import aio_pika.exceptions
import aiormq.exceptions
import asyncpg
import redis.exceptions

from worker.config import redact_url

#: SQLSTATE classes and codes that mean "try again": connection exceptions (08), transaction rollback
#: incl. deadlock and serialization failure (40), insufficient resources (53), operator intervention
#: incl. admin shutdown and query cancel (57), lock not available (55P03)
_TRANSIENT_SQLSTATE_CLASSES = ("08", "40", "53", "57")
_TRANSIENT_SQLSTATES = ("55P03",)


class TransientError(Exception):
    """Raised by the worker itself for a fault that deserves a retry (e.g. an unconfirmed publish)."""


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is a fault that another attempt may not meet."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _is_transient_one(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def _is_transient_one(exc: BaseException) -> bool:
    if isinstance(exc, TransientError | OSError | asyncio.TimeoutError | TimeoutError):
        return True
    if isinstance(exc, asyncpg.PostgresError):
        state = getattr(exc, "sqlstate", None) or ""
        return state[:2] in _TRANSIENT_SQLSTATE_CLASSES or state in _TRANSIENT_SQLSTATES
    if isinstance(exc, asyncpg.InterfaceError | asyncpg.exceptions.InternalClientError):
        # "connection is closed", "cannot perform operation: another operation is in progress" after a cut
        return True
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        return True
    # a channel closed under an event (connection lost) is not an AMQPError in aiormq, but it is the
    # broker's fault, not the event's
    return isinstance(
        exc,
        aio_pika.exceptions.AMQPError
        | aiormq.exceptions.AMQPError
        | aio_pika.exceptions.DeliveryError
        | aiormq.exceptions.ChannelInvalidStateError,
    )


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what caused it, each once (aiormq's chains loop)."""
    found: list[BaseException] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


#: how :func:`describe` begins for a TLS certificate the client did not accept
CERTIFICATE_REFUSED = "TLS certificate not accepted"


def certificate_failure(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The TLS verification failure behind ``exc`` (the server's certificate is not signed by the CA the
    URL names, has expired, or is not for the host connected to), else None.

    asyncpg raises it as it is (it is also a ``ValueError``, which must not pass for a malformed
    connection string), aio-pika and redis-py wrap it in their connection errors."""
    for current in _chain(exc):
        if isinstance(current, ssl.SSLCertVerificationError):
            return current
    return None


def is_name_resolution_failure(exc: BaseException) -> bool:
    """True when ``exc`` or an exception behind it is a failed host name lookup (``socket.gaierror``): a
    configuration problem (a misspelt host) more often than an outage."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, socket.gaierror):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def is_certificate_problem(problem: str) -> bool:
    """True for a one-line reason :func:`describe` gave for a certificate failure (logged at ERROR)."""
    return problem.startswith(CERTIFICATE_REFUSED)


def describe(exc: BaseException) -> str:
    """``Type: message`` on one line (at most 500 characters), for logs, dead-letter headers and the operator
    commands; a password the message quotes (a URL, a ``password=`` parameter) is redacted, and a TLS
    certificate the client refused says so first (``TLS certificate not accepted (...): ...``)."""
    text = " ".join(redact_url(str(exc)).split()) or "(no message)"
    line = f"{type(exc).__name__}: {text}"
    refused = certificate_failure(exc)
    if refused is not None:
        reason = refused.verify_message or "verification failed"
        if refused is not exc and refused.strerror and refused.strerror not in text:
            line += f" ({' '.join(refused.strerror.split())})"
        line = f"{CERTIFICATE_REFUSED} ({reason}): {line}"
    return line[:500]
