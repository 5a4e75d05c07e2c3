"""Which failures are worth another try, and which need a person (and what to tell them).

A transient fault is one the same event may survive on a later attempt: a dependency unreachable or
restarting, a connection cut, a deadlock, a serialization failure, a lock or statement timeout, a
publish the broker did not confirm. Anything else is a bug (``internal``) and is not retried.

A failure that needs a person is a dependency refusing the worker (a login, a vhost, a permission, a
database that does not exist, a certificate, a host name that does not resolve): waiting alone will not
fix it. :func:`explain` is the one place that turns such an exception into a line that says what to do,
for every command (``run``'s log, ``check``, ``migrate``, ``demo``, ``dlq``); :func:`needs_a_person`
tells such a line apart (``worker run`` logs it at ERROR and keeps retrying: docs/operating.md).
"""

from __future__ import annotations

import asyncio
import re
import shlex
import socket
from urllib.parse import unquote

import aio_pika.exceptions
import aiormq.exceptions
import asyncpg
import redis.exceptions

from worker.redact import CERTIFICATE_REFUSED, describe, message_of

__all__ = [
    "ClientKeyRefused",
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


# --- failures that need a person -------------------------------------------------------------------------

#: how the lines of :func:`refusal` begin (and describe's for a certificate): what needs_a_person finds
RABBITMQ_REFUSED = "RabbitMQ refused"
POSTGRES_REFUSED = "Postgres refused"
POSTGRES_NO_DATABASE = "Postgres has no database"
REDIS_REFUSED = "Redis refused"
HOST_UNKNOWN = "cannot resolve host"
_PERSON_NEEDED = (
    CERTIFICATE_REFUSED,
    KEY_REFUSED,
    RABBITMQ_REFUSED,
    POSTGRES_REFUSED,
    POSTGRES_NO_DATABASE,
    REDIS_REFUSED,
    HOST_UNKNOWN,
)
#: SQLSTATE class 28, invalid authorization: a wrong password, an unknown role, no pg_hba.conf line
_POSTGRES_LOGIN_REFUSED = "28"
_MISSING_DATABASE = re.compile(r'database "(.+)" does not exist')
_REDIS_LOGIN_REFUSED = (
    redis.exceptions.AuthenticationError,
    redis.exceptions.AuthenticationWrongNumberOfArgsError,
)


def needs_a_person(problem: str) -> bool:
    """True when ``problem`` (a line of :func:`explain`, or a list of them, one per RabbitMQ node) names a
    failure that waiting will not fix: a refused login, vhost, permission or certificate, a missing
    database, a host name that does not resolve. ``worker run`` logs it at ERROR (and keeps retrying)."""
    return any(marker in problem for marker in _PERSON_NEEDED)


def explain(exc: BaseException, url: str | None = None) -> str:
    """One line for ``exc``, met connecting to (or talking with) the dependency at ``url``: :func:`refusal`'s
    sentence when a person must act, else :func:`describe`'s ``Type: message``, with a hint where nothing
    answered (a refused connection, a silent one). Passwords never show."""
    return refusal(exc, url) or _with_hint(exc, url)


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
    for current in _chain(exc):
        said = _refusal_one(current, url)
        if said is not None:
            return said
    return None


def _refusal_one(exc: BaseException, url: str | None) -> str | None:
    user = _user_of(url)
    if isinstance(exc, ClientKeyRefused):
        return str(exc)
    if isinstance(exc, aiormq.exceptions.AuthenticationError | aiormq.exceptions.ProbableAuthenticationError):
        return (
            f"{RABBITMQ_REFUSED} the login of user {user or '(none given)'!r} (ACCESS_REFUSED): check the "
            "user and password in the URL"
        )
    if isinstance(exc, aiormq.exceptions.InvalidFrameError) and "Connection.Close" in str(exc):
        who = user or "guest"
        return (
            f"{RABBITMQ_REFUSED} vhost {_vhost_of(url)!r} to user {who!r} (does the vhost exist, and may "
            f"user {who!r} use it? rabbitmqctl list_vhosts; rabbitmqctl list_user_permissions "
            f"{shlex.quote(who)})"
        )
    if isinstance(exc, aiormq.exceptions.ChannelAccessRefused | aiormq.exceptions.ConnectionNotAllowed):
        who = user or "guest"
        return (
            f"{RABBITMQ_REFUSED} user {who!r}: {message_of(exc)} (its permissions on the vhost: rabbitmqctl "
            f"list_user_permissions {shlex.quote(who)}; deploy/README.md lists what the worker needs)"
        )
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        found = _MISSING_DATABASE.search(str(exc))
        database = found.group(1) if found else _database_of(url)
        return (
            f"{POSTGRES_NO_DATABASE} {database!r}: create it ({_createdb(url, database)}) or correct the "
            "database in the DSN"
        )
    if isinstance(exc, asyncpg.PostgresError) and (exc.sqlstate or "").startswith(_POSTGRES_LOGIN_REFUSED):
        return (
            f"{POSTGRES_REFUSED} the login: {message_of(exc)} (check the user and password in the DSN, and "
            "that the server's pg_hba.conf admits this host, user and database)"
        )
    if isinstance(
        exc, redis.exceptions.AuthenticationError | redis.exceptions.AuthenticationWrongNumberOfArgsError
    ):
        return f"{REDIS_REFUSED} the login: {message_of(exc)} (check the user and password in the URL)"
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return (
            f"{REDIS_REFUSED} a command: {message_of(exc)} (the user's ACL must allow PING, INFO and PUBLISH)"
        )
    if isinstance(exc, socket.gaierror):
        host = _host_of(url)
        return (
            f"{HOST_UNKNOWN} {repr(host) if host else 'name'} ({message_of(exc)}): check the host in the URL"
        )
    return None


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
