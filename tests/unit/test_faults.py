"""Which failures the worker retries (transient) and which it dead-letters at once (internal)."""

from __future__ import annotations

import asyncio
import socket
import ssl

import aio_pika.exceptions
import aiormq.exceptions
import asyncpg
import pytest
import redis.exceptions

from worker.broker.urls import NoNodeAnswered
from worker.faults import Problem, Refusal, TransientError, explain, is_transient, needs_a_person, refusal
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
    assert needs_a_person(explain(exc)) == Refusal("", "certificate", described)
    refused = needs_a_person(explain(exc, "rediss://127.0.0.1:6380/0"))
    assert refused is not None
    assert (refused.dependency, refused.refused) == ("Redis", "certificate")
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
    assert needs_a_person(explain(ConnectionRefusedError(111, "Connect call failed"))) is None
    assert certificate_failure(ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")) is None


# --- failures that need a person: what every command says (newcomer review 4, F2, F6, F15) ----------------

VHOST_CLOSED = aiormq.exceptions.InvalidFrameError(
    "Expected one of ['Connection.OpenOk'], got <Connection.Close object at 0x7f082ba91a90>"
)
LOGIN_REFUSED = aiormq.exceptions.ProbableAuthenticationError(
    "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
    "For details see the broker logfile."
)
#: what aiormq raises for a channel the broker closed with 403 (it passes only the reply text)
OPERATION_REFUSED = aiormq.exceptions.ChannelAccessRefused(
    "ACCESS_REFUSED - access to exchange 'tomori.tool_calls' in vhost '/' refused for user 'w'"
)


#: a refusal of each kind: the exception, the URL it was met at, what explain says
REFUSALS = [
    (
        VHOST_CLOSED,
        "amqp://nc4:s3cret@127.0.0.1:5672/nc4-ltm-typo",
        "RabbitMQ refused vhost 'nc4-ltm-typo' to user 'nc4' (does the vhost exist, and may user 'nc4' "
        "use it? rabbitmqctl list_vhosts; rabbitmqctl list_user_permissions nc4)",
    ),
    (
        VHOST_CLOSED,
        "amqp://127.0.0.1/",
        "RabbitMQ refused vhost '/' to user 'guest' (does the vhost exist, and may user 'guest' use it? "
        "rabbitmqctl list_vhosts; rabbitmqctl list_user_permissions guest)",
    ),
    (
        LOGIN_REFUSED,
        "amqp://guest:wrong@127.0.0.1:5672/",
        "RabbitMQ refused the login of user 'guest' (ACCESS_REFUSED): check the user and password in the URL",
    ),
    (
        OPERATION_REFUSED,
        "amqp://w:s3cret@rmq/",
        "RabbitMQ refused user 'w': ACCESS_REFUSED - access to exchange 'tomori.tool_calls' in vhost '/' "
        "refused for user 'w' (its permissions on the vhost: rabbitmqctl list_user_permissions w; "
        "deploy/README.md lists what the worker needs)",
    ),
    (
        asyncpg.InvalidCatalogNameError('database "ltm nc4" does not exist'),
        "postgresql://ltm:s3cret@pg-a:5433,pg-b:5434/ltm%20nc4?sslmode=verify-full",
        "Postgres has no database 'ltm nc4': create it (createdb -h pg-a -p 5433 -U ltm 'ltm nc4') or "
        "correct the database in the DSN",
    ),
    (
        asyncpg.InvalidCatalogNameError('database "ltm_demo" does not exist'),
        None,
        "Postgres has no database 'ltm_demo': create it (createdb ltm_demo) or correct the database in "
        "the DSN",
    ),
    (
        asyncpg.InvalidPasswordError('password authentication failed for user "ltm"'),
        "postgresql://ltm:s3cret@[::1]:5432/tomoribot",
        'Postgres refused the login: password authentication failed for user "ltm" (check the user and '
        "password in the DSN, and that the server's pg_hba.conf admits this host, user and database)",
    ),
    (
        redis.exceptions.AuthenticationError("invalid username-password pair or user is disabled."),
        "redis://:s3cret@127.0.0.1:6379/0",
        "Redis refused the login: invalid username-password pair or user is disabled. (check the user "
        "and password in the URL)",
    ),
    (
        redis.exceptions.NoPermissionError("this user has no permissions to run the 'info' command"),
        "redis://w:s3cret@127.0.0.1:6379/0",
        "Redis refused a command: this user has no permissions to run the 'info' command (the user's ACL "
        "must allow PING, INFO and PUBLISH)",
    ),
    (
        _wrapped(
            aiormq.exceptions.AMQPConnectionError(-2, "Name or service not known"),
            socket.gaierror(-2, "Name or service not known"),
        ),
        "amqp://guest:s3cret@rmq.nowhere.invalid:5672/",
        "cannot resolve host 'rmq.nowhere.invalid' ([Errno -2] Name or service not known): check the "
        "host in the URL",
    ),
]
REFUSAL_IDS = [
    "vhost",
    "vhost-default-user",
    "login",
    "permission",
    "no-database",
    "no-database-no-dsn",
    "postgres-login",
    "redis-login",
    "redis-acl",
    "unknown-host",
]
#: the dependency and what it refused, per case of REFUSALS
REFUSED = [
    ("RabbitMQ", "vhost"),
    ("RabbitMQ", "vhost"),
    ("RabbitMQ", "login"),
    ("RabbitMQ", "permission"),
    ("Postgres", "database"),
    ("Postgres", "database"),
    ("Postgres", "login"),
    ("Redis", "login"),
    ("Redis", "permission"),
    ("RabbitMQ", "host"),
]


@pytest.mark.parametrize(
    ("exc", "url", "said", "refused"),
    [(*case, kind) for case, kind in zip(REFUSALS, REFUSED, strict=True)],
    ids=REFUSAL_IDS,
)
def test_a_refusal_says_what_to_do_and_needs_a_person(
    exc: BaseException, url: str | None, said: str, refused: tuple[str, str]
) -> None:
    assert refusal(exc, url) == said
    problem = explain(exc, url)
    assert problem == said
    assert needs_a_person(problem) == Refusal(*refused, said)
    assert "s3cret" not in said


@pytest.mark.parametrize(("exc", "url", "said"), REFUSALS, ids=REFUSAL_IDS)
def test_a_node_that_refuses_among_several_that_are_down_needs_a_person(
    exc: BaseException, url: str | None, said: str
) -> None:
    down = explain(ConnectionRefusedError(111, "Connect call failed"), "amqp://guest@rmq-2/")
    problems = [down, Problem(f"amqp://rmq-1/: {explain(exc, url)}", explain(exc, url).refusal)]
    everywhere = NoNodeAnswered("no RabbitMQ node answered: " + "; ".join(problems), problems)
    problem = explain(everywhere, "amqp://guest@rmq-2/")
    assert said in problem
    refused = needs_a_person(problem)
    assert refused is not None
    assert refused.line == said
    assert needs_a_person(explain(NoNodeAnswered("no RabbitMQ node answered: ...", [down, down]))) is None


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("cannot resolve host 'x' in the event's text"),
        ValueError("RabbitMQ refused the login of user 'guest': a quoted sentence"),
        asyncpg.exceptions.DataError("Postgres has no database 'x' (an event's own words)"),
    ],
    ids=["host-words", "login-words", "database-words"],
)
def test_the_words_of_a_refusal_in_another_failure_do_not_make_it_one(exc: BaseException) -> None:
    """What needs a person is what the exception is, not what its message happens to say."""
    problem = explain(exc, "amqp://guest@127.0.0.1/")
    assert needs_a_person(problem) is None
    assert needs_a_person(Problem(str(problem))) is None


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5627)"),
        aiormq.exceptions.ConnectionClosed(320, "CONNECTION_FORCED - shutdown"),
        asyncpg.CannotConnectNowError("the database system is starting up"),
        redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_an_outage_is_described_as_it_is_and_waited_on(exc: BaseException) -> None:
    assert refusal(exc, "amqp://guest:guest@127.0.0.1/") is None
    assert explain(exc, "amqp://guest:guest@127.0.0.1/").startswith(describe(exc))  # a hint may follow
    assert needs_a_person(explain(exc, "amqp://guest:guest@127.0.0.1/")) is None


def test_postgres_failures_go_through_the_same_words() -> None:
    dsn = "postgresql://postgres:s3cret@127.0.0.1:5432/ltm_nc4_nosuchdb"
    missing = asyncpg.InvalidCatalogNameError('database "ltm_nc4_nosuchdb" does not exist')

    assert describe_failure(missing, dsn) == (
        "Postgres has no database 'ltm_nc4_nosuchdb': create it (createdb -h 127.0.0.1 -p 5432 -U postgres "
        "ltm_nc4_nosuchdb) or correct the database in the DSN"
    )


def test_nothing_answering_names_the_dependency_host_and_port() -> None:
    """Newcomer review 5, N12: a refused connection and a silent login say where, and what to check."""
    refused = ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 2543)")
    said = explain(refused, "postgresql://postgres:secret@127.0.0.1:2543/ltm")
    assert said.endswith(
        "(nothing listens at 127.0.0.1:2543: is Postgres running there? check the host and port)"
    )
    assert "secret" not in said
    assert "is Redis running there" in explain(refused, "redis://127.0.0.1:46380/0")
    silent = explain(TimeoutError(), "amqp://guest:guest@rabbit.internal:5672/ltm")
    assert silent == "RabbitMQ at rabbit.internal:5672 did not answer in time (connecting, logging in): " + (
        "overloaded or stopped?"
    )
    assert explain(refused) == describe(refused), "no URL, no hint"
