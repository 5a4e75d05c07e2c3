"""Which failures are worth another try, and which need a person (and what to tell them).

A transient fault is one the same event may survive on a later attempt: a dependency unreachable or
restarting, a connection cut, a deadlock, a serialization failure, a lock or statement timeout, a
publish the broker did not confirm. Anything else is a bug (``internal``) and is not retried.

A failure that needs a person is a dependency refusing the worker (a login, a vhost, a permission, a
database that does not exist, a certificate, a host name that does not resolve): waiting alone will not
fix it. :func:`explain` is the one place that turns such an exception into a line that says what to do,
for every command (``run``'s log, ``check``, ``migrate``, ``demo``, ``dlq``). The line is a
:class:`Problem`: a ``str`` that also carries the :class:`Refusal` it found, so :func:`needs_a_person`
reads what was found instead of searching the sentence (``worker run`` logs a refusal at ERROR and keeps
retrying: docs/operating.md).
"""

from __future__ import annotations

import asyncio
import re
import shlex
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote

import aio_pika.exceptions
import aiormq.exceptions
import asyncpg

from worker.redact import certificate_failure, describe, message_of

__all__ = [
    "ClientKeyRefused",
    "FailedEverywhere",
    "Problem",
    "Refusal",
    "TransientError",
    "explain",
    "is_transient",
    "needs_a_person",
    "refusal",
]

#: SQLSTATE classes and codes that mean "try again": connection exceptions (08), transaction rollback
#: incl. deadlock and serialization failure (40), insufficient resources (53), operator intervention
#: incl. admin shutdown and query cancel (57), lock not available (55P03)
_TRANSIENT_SQLSTATE_CLASSES = ("08", "40", "53", "57")
_TRANSIENT_SQLSTATES = ("55P03",)


class TransientError(Exception):
    """Raised by the worker itself for a fault that deserves a retry (e.g. an unconfirmed publish)."""


#: how the worker's refusal of a Postgres client key begins (worker/store/pool.py)
KEY_REFUSED = "TLS client key refused"


class ClientKeyRefused(PermissionError):
    """A Postgres client key file that libpq would refuse to use (group or world access), refused the same
    way before any connection (worker/store/pool.py ``client_key_problem``); the message is libpq's."""

    def __str__(self) -> str:
        return f"{KEY_REFUSED}: {super().__str__()}"


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
    if _redis_error(exc, "ConnectionError", "TimeoutError"):
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


# --- failures that need a person -------------------------------------------------------------------------

#: how the lines of :func:`refusal` begin
RABBITMQ_REFUSED = "RabbitMQ refused"
POSTGRES_REFUSED = "Postgres refused"
POSTGRES_NO_DATABASE = "Postgres has no database"
REDIS_REFUSED = "Redis refused"
HOST_UNKNOWN = "cannot resolve host"

#: what a dependency refused: a login, a vhost, a permission (an operation, a command), a database that
#: does not exist, a client key or a certificate (TLS), a host name (it does not resolve)
Refused = Literal["login", "vhost", "permission", "database", "client key", "certificate", "host"]


@dataclass(frozen=True)
class Refusal:
    """A dependency refusing the worker, which waiting alone will not fix: someone must act. ``line`` says
    what to do; ``dependency`` is "RabbitMQ", "Postgres" or "Redis", or "" when the URL does not say."""

    dependency: str
    refused: Refused
    line: str


class Problem(str):
    """A line of :func:`explain` (what failed, in words a person reads) and the :class:`Refusal` behind it,
    None for a failure that may pass by itself (an outage, a timeout). It is a ``str``: it is logged,
    printed and compared as the line."""

    refusal: Refusal | None

    def __new__(cls, line: str, refusal: Refusal | None = None) -> Problem:
        problem = super().__new__(cls, line)
        problem.refusal = refusal
        return problem


class FailedEverywhere(ConnectionError):
    """Every one of several attempts failed (one per RabbitMQ node: worker/broker/urls.py), each explained:
    a person is needed when one of them needs one."""

    def __init__(self, message: str, problems: Sequence[Problem]) -> None:
        super().__init__(message)
        self.problems = tuple(problems)


#: SQLSTATE class 28, invalid authorization: a wrong password, an unknown role, no pg_hba.conf line
_POSTGRES_LOGIN_REFUSED = "28"
_MISSING_DATABASE = re.compile(r'database "(.+)" does not exist')
_REDIS_LOGIN_REFUSED = ("AuthenticationError", "AuthenticationWrongNumberOfArgsError")


def _redis_error(exc: BaseException, *names: str) -> bool:
    """Whether ``exc`` is one of redis's exceptions ``names``. redis is not imported for the question (it
    costs a command such as ``worker dlq list`` a tenth of a second): an exception of redis's was raised by
    redis, which is imported by then."""
    module = sys.modules.get("redis.exceptions")
    return module is not None and isinstance(exc, tuple(getattr(module, name) for name in names))


def needs_a_person(problem: Problem) -> Refusal | None:
    """The refusal behind ``problem`` (a line of :func:`explain`; for several RabbitMQ nodes, the first node
    refused) when it is a failure waiting will not fix: a refused login, vhost, permission, client key or
    certificate, a missing database, a host name that does not resolve; None otherwise. ``worker run`` logs
    it at ERROR (and keeps retrying)."""
    return problem.refusal


def explain(exc: BaseException, url: str | None = None) -> Problem:
    """One line for ``exc``, met connecting to (or talking with) the dependency at ``url``: :func:`refusal`'s
    sentence when a person must act, else :func:`describe`'s ``Type: message``, with a hint where nothing
    answered (a refused connection, a silent one). Passwords never show. The line carries its
    :class:`Refusal` (:func:`needs_a_person`)."""
    refused = _refused(exc, url)
    if refused is not None:
        return Problem(refused.line, refused)
    line = _with_hint(exc, url)
    return Problem(line, _certificate_refused(exc, url, line) or _refused_somewhere(exc))


def _certificate_refused(exc: BaseException, url: str | None, line: str) -> Refusal | None:
    """A TLS certificate the client did not accept (:func:`describe` words it)."""
    if certificate_failure(exc) is None:
        return None
    scheme = (url or "").partition("://")[0].lower()
    return Refusal(_DEPENDENCIES.get(scheme, ""), "certificate", line)


def _refused_somewhere(exc: BaseException) -> Refusal | None:
    """The first refusal among the attempts of a :class:`FailedEverywhere` in ``exc``'s chain."""
    for current in _chain(exc):
        if isinstance(current, FailedEverywhere):
            for problem in current.problems:
                if problem.refusal is not None:
                    return problem.refusal
    return None


#: the dependency a URL's scheme names, for the hints
_DEPENDENCIES = {
    "postgresql": "Postgres",
    "postgres": "Postgres",
    "redis": "Redis",
    "rediss": "Redis",
    "amqp": "RabbitMQ",
    "amqps": "RabbitMQ",
}


def _with_hint(exc: BaseException, url: str | None) -> str:
    """:func:`describe`'s line, and what to look at when nothing answered at the URL's host and port."""
    said = describe(exc)
    scheme = (url or "").partition("://")[0].lower()
    name = _DEPENDENCIES.get(scheme)
    host, port = _host_and_port(url)
    if name is None or not host:
        return said
    where = f"{unquote(host)}:{port}" if port else unquote(host)
    chain = _chain(exc)
    if any(isinstance(current, ConnectionRefusedError) for current in chain):
        return f"{said} (nothing listens at {where}: is {name} running there? check the host and port)"
    if any(isinstance(current, TimeoutError) for current in chain) and "(no message)" in said:
        return f"{name} at {where} did not answer in time (connecting, logging in): overloaded or stopped?"
    return said


def refusal(exc: BaseException, url: str | None = None) -> str | None:
    """What to do about a dependency that refused the worker, in words that say it (the user and the vhost
    taken from ``url``, never its password); None for any other failure.

    - RabbitMQ: a login refused (``ACCESS_REFUSED``), a vhost refused (aiormq only says it got a
      ``Connection.Close`` instead of ``OpenOk``: the vhost does not exist, or the user has no permission on
      it), an operation refused (a channel's ``ACCESS_REFUSED``: the user's permissions);
    - Postgres: a database that does not exist (with the ``createdb`` line that makes it), a login refused;
    - Redis: a login refused (``WRONGPASS``, ``NOAUTH``), a command refused (``NOPERM``: its ACL);
    - a host name that does not resolve.

    A refused TLS certificate is :func:`describe`'s (``TLS certificate not accepted (...)``).
    """
    refused = _refused(exc, url)
    return refused.line if refused is not None else None


def _refused(exc: BaseException, url: str | None) -> Refusal | None:
    for current in _chain(exc):
        refused = _refusal_one(current, url)
        if refused is not None:
            return refused
    return None


def _refusal_one(exc: BaseException, url: str | None) -> Refusal | None:
    user = _user_of(url)
    if isinstance(exc, ClientKeyRefused):
        return Refusal("Postgres", "client key", str(exc))
    if isinstance(exc, aiormq.exceptions.AuthenticationError | aiormq.exceptions.ProbableAuthenticationError):
        return _rabbitmq(
            "login",
            f"{RABBITMQ_REFUSED} the login of user {user or '(none given)'!r} (ACCESS_REFUSED): check the "
            "user and password in the URL",
        )
    if isinstance(exc, aiormq.exceptions.InvalidFrameError) and "Connection.Close" in str(exc):
        who = user or "guest"
        return _rabbitmq(
            "vhost",
            f"{RABBITMQ_REFUSED} vhost {_vhost_of(url)!r} to user {who!r} (does the vhost exist, and may "
            f"user {who!r} use it? rabbitmqctl list_vhosts; rabbitmqctl list_user_permissions "
            f"{shlex.quote(who)})",
        )
    if isinstance(exc, aiormq.exceptions.ChannelAccessRefused | aiormq.exceptions.ConnectionNotAllowed):
        who = user or "guest"
        return _rabbitmq(
            "permission",
            f"{RABBITMQ_REFUSED} user {who!r}: {message_of(exc)} (its permissions on the vhost: rabbitmqctl "
            f"list_user_permissions {shlex.quote(who)}; deploy/README.md lists what the worker needs)",
        )
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        found = _MISSING_DATABASE.search(str(exc))
        database = found.group(1) if found else _database_of(url)
        return Refusal(
            "Postgres",
            "database",
            f"{POSTGRES_NO_DATABASE} {database!r}: create it ({_createdb(url, database)}) or correct the "
            "database in the DSN",
        )
    if isinstance(exc, asyncpg.PostgresError) and (exc.sqlstate or "").startswith(_POSTGRES_LOGIN_REFUSED):
        return Refusal(
            "Postgres",
            "login",
            f"{POSTGRES_REFUSED} the login: {message_of(exc)} (check the user and password in the DSN, and "
            "that the server's pg_hba.conf admits this host, user and database)",
        )
    if _redis_error(exc, *_REDIS_LOGIN_REFUSED):
        return Refusal(
            "Redis",
            "login",
            f"{REDIS_REFUSED} the login: {message_of(exc)} (check the user and password in the URL)",
        )
    if _redis_error(exc, "NoPermissionError"):
        return Refusal(
            "Redis",
            "permission",
            f"{REDIS_REFUSED} a command: {message_of(exc)} "
            "(the user's ACL must allow PING, INFO and PUBLISH)",
        )
    if isinstance(exc, socket.gaierror):
        host = _host_of(url)
        scheme = (url or "").partition("://")[0].lower()
        return Refusal(
            _DEPENDENCIES.get(scheme, ""),
            "host",
            f"{HOST_UNKNOWN} {repr(host) if host else 'name'} ({message_of(exc)}): check the host in the URL",
        )
    return None


def _rabbitmq(refused: Refused, line: str) -> Refusal:
    return Refusal("RabbitMQ", refused, line)


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


def _parts(url: str | None) -> tuple[str, str, str]:
    """``(userinfo, first host[:port], path)`` of a URL (the first host of a multi-host DSN), or blanks."""
    if not url or "://" not in url:
        return "", "", ""
    rest = url.split("://", 1)[1]
    authority = re.split(r"[/?]", rest, maxsplit=1)[0]
    userinfo, _, hosts = authority.rpartition("@")
    return userinfo, hosts.split(",")[0], rest[len(authority) :].partition("?")[0]


def _user_of(url: str | None) -> str:
    return unquote(_parts(url)[0].partition(":")[0])


def _host_and_port(url: str | None) -> tuple[str, str]:
    host = _parts(url)[1]
    if host.startswith("["):
        name, _, after = host[1:].partition("]")
        return name, after.removeprefix(":")
    name, _, port = host.partition(":")
    return name, port


def _host_of(url: str | None) -> str:
    return unquote(_host_and_port(url)[0])


def _vhost_of(url: str | None) -> str:
    path = _parts(url)[2]
    return unquote(path[1:]) if len(path) > 1 else "/"


def _database_of(url: str | None) -> str:
    path = _parts(url)[2]
    return unquote(path[1:]) or _user_of(url) or "postgres"


def _createdb(url: str | None, database: str) -> str:
    """The ``createdb`` command that makes ``database`` on the server of the DSN ``url``."""
    host, port = _host_and_port(url)
    user = _user_of(url)
    words = ["createdb"]
    if host:
        words += ["-h", unquote(host)]
    if port:
        words += ["-p", port]
    if user:
        words += ["-U", user]
    return shlex.join([*words, database])
