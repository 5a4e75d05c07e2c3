"""Which failures are worth another try.

A transient fault is one the same event may survive on a later attempt: a dependency unreachable or
restarting, a connection cut, a deadlock, a serialization failure, a lock or statement timeout, a
publish the broker did not confirm. Anything else is a bug (``internal``) and is not retried.
"""

from __future__ import annotations

import asyncio
import socket

import aio_pika.exceptions
import aiormq.exceptions
import asyncpg
import redis.exceptions

from worker.redact import CERTIFICATE_REFUSED

__all__ = [
    "TransientError",
    "is_certificate_problem",
    "is_name_resolution_failure",
    "is_transient",
]

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
