"""The ``worker`` command as an operator meets it: ``migrate``, ``check`` and ``run`` in real processes.

Each failure must be one line naming the problem (passwords redacted) and a non-zero exit, never a Python
traceback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from importlib.metadata import version
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.services import redact
from tests.support.harness import REPO, WorkerProcess
from worker.config import env_of

pytestmark = pytest.mark.integration


def cli_env(**settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LTM_", "MAX_"))}
    env.update({"PYTHONUNBUFFERED": "1", **env_of(log_format="json"), **settings})
    return env


def worker(*args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    """``python -m worker ARGS`` with only ``settings`` in its environment, no terminal on stdin."""
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        cwd=REPO,
        env=cli_env(**settings),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def with_database(dsn: str, database: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))


def with_password(dsn: str, password: str) -> str:
    parts = urlsplit(dsn)
    user = parts.username or "postgres"
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port or 5432}"))


def missing_database(postgres_dsn: str) -> str:
    return with_database(postgres_dsn, f"ltm_missing_{uuid.uuid4().hex[:12]}")


def no_database_sentence(dsn: str) -> str:
    """What every command says about the missing database of ``dsn`` (worker/faults.py)."""
    parts = urlsplit(dsn)
    database = parts.path[1:]
    createdb = f"createdb -h {parts.hostname} -p {parts.port} -U {parts.username} {database}"
    return f"Postgres has no database {database!r}: create it ({createdb}) or correct the database in the DSN"


def bad_sslmode(postgres_dsn: str) -> str:
    return with_password(postgres_dsn, "s3cret") + "?sslmode=bogus"


# --- migrate: every Postgres-side failure is one line and exit 1 ----------------------------------------


def migrate_failure(dsn: str) -> dict[str, Any]:
    done = worker("migrate", LTM_POSTGRES_DSN=dsn)

    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = json_lines(done.stderr)
    assert line["level"] == "error"
    return line


def test_migrate_names_a_missing_database(postgres_dsn: str) -> None:
    dsn = missing_database(postgres_dsn)
    line = migrate_failure(dsn)

    assert line["event"] == "migration failed"
    assert line["error"] == no_database_sentence(dsn)
    assert line["dsn"] == redact(dsn)  # a container's Postgres has a password


def test_migrate_names_a_role_that_does_not_exist(postgres_dsn: str) -> None:
    parts = urlsplit(postgres_dsn)
    line = migrate_failure(urlunsplit(parts._replace(netloc=f"nobody_here@{parts.hostname}:{parts.port}")))

    assert line["event"] == "migration failed"
    # trust auth (this machine's Postgres) says the role is missing; password auth (a container) refuses first
    advice = "(check the user and password in the DSN, and that the server's pg_hba.conf admits this host"
    assert line["error"] in {
        f'Postgres refused the login: role "nobody_here" does not exist {advice}, user and database)',
        f'Postgres refused the login: password authentication failed for user "nobody_here" {advice}, user '
        "and database)",
    }


def test_migrate_names_an_invalid_connection_string_without_its_password(postgres_dsn: str) -> None:
    line = migrate_failure(bad_sslmode(postgres_dsn))

    assert line["event"] == "invalid Postgres connection string"
    assert line["error"].startswith("invalid connection string: `sslmode` parameter must be one of")
    assert ":***@" in line["dsn"]
    assert "s3cret" not in json.dumps(line)


def test_migrate_names_an_unreachable_server() -> None:
    line = migrate_failure("postgresql://postgres:s3cret@127.0.0.1:1/postgres")

    assert line["event"] == "cannot reach Postgres"
    assert line["error"].startswith("ConnectionRefusedError: ")
    assert line["dsn"] == "postgresql://postgres:***@127.0.0.1:1/postgres"


# --- check and run say the same, in their own way --------------------------------------------------------


def test_check_names_a_missing_database_and_a_bad_connection_string(
    postgres_dsn: str, redis_url: str
) -> None:
    for dsn, problem in (
        (missing_database(postgres_dsn), "Postgres has no database 'ltm_missing_"),
        (bad_sslmode(postgres_dsn), "invalid connection string: `sslmode` parameter must be one of"),
    ):
        done = worker("check", LTM_POSTGRES_DSN=dsn, LTM_REDIS_URL=redis_url)

        assert done.returncode == 1, done.stdout + done.stderr
        assert "Traceback" not in done.stdout + done.stderr
        postgres = done.stdout.split("\n", 2)[:2]
        assert postgres[0].split() == ["FAIL", "postgres", redact(dsn)]
        assert postgres[1].strip().startswith(problem), done.stdout


async def test_run_waits_naming_a_missing_database_in_one_line(
    postgres_dsn: str, redis_url: str, tmp_path: Path
) -> None:
    dsn = missing_database(postgres_dsn)
    process = WorkerProcess(
        cli_env(LTM_POSTGRES_DSN=dsn, LTM_REDIS_URL=redis_url), tmp_path / "worker.log"
    ).start()
    try:
        await process.wait_for_log("waiting for dependency")
        process.signal(signal.SIGTERM)
        assert await process.wait_exit() == 0
    finally:
        process.kill()

    text = process.log_path.read_text()
    assert "Traceback" not in text
    assert "s3cret" not in text
    waits = [line for line in process.lines() if line["event"] == "waiting for dependency"]
    assert waits[0]["dependency"] == "postgres"
    assert waits[0]["problem"] == no_database_sentence(dsn)
    assert waits[0]["level"] == "error"  # a person must create it; the worker waits all the same


async def test_run_exits_at_once_on_a_connection_string_that_can_never_work(
    postgres_dsn: str, redis_url: str, tmp_path: Path
) -> None:
    """A malformed DSN does not fix itself: one line naming it, exit 1, no endless wait."""
    process = WorkerProcess(
        cli_env(LTM_POSTGRES_DSN=bad_sslmode(postgres_dsn), LTM_REDIS_URL=redis_url), tmp_path / "worker.log"
    ).start()
    try:
        assert await process.wait_exit(timeout=30) == 1
    finally:
        process.kill()

    text = process.log_path.read_text()
    assert "Traceback" not in text
    assert "s3cret" not in text
    [line] = [line for line in process.lines() if line["event"] == "cannot start"]
    assert line["level"] == "error"
    assert line["error"].startswith("invalid Postgres connection string: `sslmode` parameter must be one of")
    assert process.count("waiting for dependency") == 0


# --- settings that fall back, --version, check --json ----------------------------------------------------

FALLBACKS = {
    "MAX_SERVER_MEMORIES": "abc",
    "LTM_HTTP_PORT": "notaport",
    "LTM_LOG_FORMAT": "xml",
    "LTM_LOG_LEVEL": "verbose",
    "LTM_TRACING": "jaeger",
}


def test_version_is_the_installed_packages() -> None:
    done = worker("--version")

    assert (done.returncode, done.stdout) == (0, f"worker {version('tomoribot-ltm-worker')}\n")


async def test_check_lists_every_fallback_as_a_warning_that_does_not_fail_it(
    migrated_dsn: str, rabbitmq_url: str, redis_url: str
) -> None:
    services = {
        "LTM_POSTGRES_DSN": migrated_dsn,
        "LTM_RABBITMQ_URL": rabbitmq_url,
        "LTM_REDIS_URL": redis_url,
    }
    done = worker("check", **services, **FALLBACKS)

    assert done.returncode == 0, done.stdout + done.stderr
    warnings = [line for line in done.stdout.splitlines() if line.startswith("warn")]
    assert warnings == [
        "warn  MAX_SERVER_MEMORIES='abc' is not an integer > 0; using 100",
        "warn  LTM_HTTP_PORT='notaport' is not a port number 0..65535 (0 or empty: off); using 0",
        "warn  LTM_LOG_FORMAT='xml' is not one of auto, json, console; using 'auto'",
        "warn  LTM_LOG_LEVEL='verbose' is not one of debug, info, warning, error; using 'info'",
        "warn  LTM_TRACING='jaeger' is not one of off, otlp, console; using 'off'",
    ]
    assert done.stdout.splitlines()[-1] == "all dependencies work (5 settings fell back to the default)"

    clean = worker("check", **services)
    assert clean.returncode == 0
    assert "warn" not in clean.stdout
    assert clean.stdout.splitlines()[-1] == "all dependencies work"


async def test_check_json_is_one_object_with_the_same_verdict_and_exit_code(
    migrated_dsn: str, rabbitmq_url: str, redis_url: str
) -> None:
    services = {
        "LTM_POSTGRES_DSN": migrated_dsn,
        "LTM_RABBITMQ_URL": rabbitmq_url,
        "LTM_REDIS_URL": redis_url,
    }
    done = worker("check", "--json", **services, LTM_HTTP_PORT="notaport")

    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True
    assert list(report["dependencies"]) == ["postgres", "rabbitmq", "redis"]
    for name, dependency in report["dependencies"].items():
        assert set(dependency) == {"ok", "target", "detail", "problem"}, name
        assert (dependency["ok"], dependency["problem"]) == (True, None), name
    assert report["dependencies"]["postgres"]["detail"].endswith("schema up to date")
    assert report["fallbacks"] == [
        {
            "variable": "LTM_HTTP_PORT",
            "value": "notaport",
            "default": 0,
            "expected": "a port number 0..65535 (0 or empty: off)",
        }
    ]

    broken = worker("check", "--json", **{**services, "LTM_REDIS_URL": "redis://:s3cret@127.0.0.1:1/0"})
    assert broken.returncode == 1
    report = json.loads(broken.stdout)
    assert (report["ok"], report["fallbacks"]) == (False, [])
    redis = report["dependencies"]["redis"]
    assert redis["ok"] is False
    assert redis["target"] == "redis://:***@127.0.0.1:1/0"
    assert redis["problem"] == redis["detail"]
    assert redis["problem"].startswith("ConnectionError: ")
    assert report["dependencies"]["postgres"]["ok"] is True


async def test_migrate_warns_about_each_fallback(migrated_dsn: str) -> None:
    done = worker("migrate", LTM_POSTGRES_DSN=migrated_dsn, LTM_HTTP_PORT="notaport", LTM_LOG_LEVEL="verbose")

    assert done.returncode == 0, done.stderr
    lines = json_lines(done.stderr)
    assert [(line["level"], line["event"]) for line in lines] == [
        ("warning", "invalid setting, using the default"),
        ("warning", "invalid setting, using the default"),
        ("info", "schema is up to date"),
    ]
    assert [(line["variable"], line["value"], line["default"]) for line in lines[:2]] == [
        ("LTM_HTTP_PORT", "notaport", 0),
        ("LTM_LOG_LEVEL", "verbose", "info"),
    ]


# --- a reader that went away (newcomer review 4, F1) ------------------------------------------------------


def worker_into_a_closed_pipe(*args: str, **settings: str) -> int:
    """``python -m worker ARGS`` with stdout and stderr a pipe nobody reads (``| head -0``): its exit code."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "worker", *args],
            cwd=REPO,
            env=cli_env(**settings),
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=write_end,
            timeout=90,
            check=False,
        )
    finally:
        os.close(write_end)
    return done.returncode


@pytest.mark.parametrize(
    "args", [("migrate",), ("check",), ("demo", "seed"), ("dlq", "list")], ids=lambda a: " ".join(a)
)
async def test_a_command_whose_reader_went_away_ends_as_it_does_with_one(
    args: tuple[str, ...], migrated_dsn: str, rabbitmq_url: str, redis_url: str
) -> None:
    """Every write into the closed pipe fails (EPIPE); the command does its work and exits with its own
    code all the same, not with a traceback's 1 or a failed flush's 120."""
    services = {
        "LTM_POSTGRES_DSN": migrated_dsn,
        "LTM_RABBITMQ_URL": rabbitmq_url,
        "LTM_REDIS_URL": redis_url,
    }
    unread = worker_into_a_closed_pipe(*args, **services)
    read = worker(*args, **services)

    assert unread == read.returncode, read.stdout + read.stderr
    assert unread == (4 if args[0] == "dlq" else 0)  # dlq: no DLQ on a fresh vhost


# --- a refused vhost or login: the same sentence in every command (newcomer review 4, F2, F6) -------------


def refused(rabbitmq_url: str, mistake: str) -> tuple[str, str]:
    """The URL with a vhost that does not exist or a wrong password, and the sentence every command says."""
    parts = urlsplit(rabbitmq_url)
    user = parts.username or "guest"
    if mistake == "vhost":
        vhost = parts.path[1:] + "-typo"
        url = urlunsplit(parts._replace(path="/" + vhost))
        return url, (
            f"RabbitMQ refused vhost {vhost!r} to user {user!r} (does the vhost exist, and may user {user!r} "
            f"use it? rabbitmqctl list_vhosts; rabbitmqctl list_user_permissions {user})"
        )
    url = urlunsplit(parts._replace(netloc=f"{user}:s3cret-wrong@{parts.hostname}:{parts.port or 5672}"))
    return url, (
        f"RabbitMQ refused the login of user {user!r} (ACCESS_REFUSED): check the user and password in the "
        "URL"
    )


@pytest.mark.parametrize("mistake", ["vhost", "password"])
async def test_a_refused_vhost_or_login_says_what_to_do_in_every_command(
    mistake: str, migrated_dsn: str, rabbitmq_url: str, redis_url: str, tmp_path: Path
) -> None:
    url, sentence = refused(rabbitmq_url, mistake)
    services = {"LTM_POSTGRES_DSN": migrated_dsn, "LTM_RABBITMQ_URL": url, "LTM_REDIS_URL": redis_url}
    unreachable = f"cannot reach RabbitMQ at {redact(url)}: {sentence}"

    check = worker("check", **services)
    demo = worker("demo", "send", "--timeout", "10", **services)
    dlq = worker("dlq", "list", **services)

    assert check.returncode == 1, check.stdout + check.stderr
    assert f"FAIL  rabbitmq  {redact(url)}\n      {sentence}\n" in check.stdout
    assert (demo.returncode, demo.stderr) == (3, f"worker demo: {unreachable}\n")
    assert (dlq.returncode, dlq.stderr) == (3, f"{unreachable}\n")

    # `run` keeps trying (a vhost made or a password fixed later heals it), each try one ERROR line
    process = WorkerProcess(cli_env(**services), tmp_path / "worker.log").start()
    try:
        await process.wait_for_log("rabbitmq unavailable", at_least=2)
        process.signal(signal.SIGTERM)
        assert await process.wait_exit() == 0
    finally:
        process.kill()
    tries = [line for line in process.lines() if line["event"] == "rabbitmq unavailable"]
    assert {(line["level"], line["error"]) for line in tries} == {("error", sentence)}
    assert [line for line in process.lines() if str(line.get("logger", "")).startswith("aio")] == []
    for output in (check.stdout, demo.stderr, dlq.stderr, process.log_path.read_text()):
        assert "s3cret" not in output
        assert "Traceback" not in output


# --- settings' notes: listed by check, logged by run and migrate (newcomer 4, F7; security 4, N9) ----------


async def test_every_setting_note_is_listed_by_check_and_logged_by_run_and_migrate(
    migrated_dsn: str, rabbitmq_url: str, redis_url: str, tmp_path: Path
) -> None:
    # 192.0.2.1 (TEST-NET-1) is an address no network routes: Postgres there never answers, and being an
    # address, not a name that resolves nowhere, it is noted for its missing sslmode
    remote = urlunsplit(urlsplit(migrated_dsn)._replace(netloc="ltm@192.0.2.1:5432"))
    settings = {
        "LTM_POSTGRES_DSN": remote,
        "LTM_RABBITMQ_URL": rabbitmq_url,
        "LTM_REDIS_URL": redis_url,
        "LTM_CONCURRENCY": "3O",
        "LTM_CONCURENCY": "4",
    }
    notes = [
        "LTM_POSTGRES_DSN reaches '192.0.2.1' without sslmode: the server is not "
        "verified, and without TLS on offer the connection goes on in plaintext without a word; say "
        "sslmode=verify-full (docs/tls.md), or sslmode=disable to choose plaintext in the open",
        "LTM_CONCURRENCY='3O' read as 3 (the text after the digits is ignored, as parseInt does)",
        "unknown setting LTM_CONCURENCY; did you mean LTM_CONCURRENCY?",
    ]

    check = worker("check", **settings)
    report = json.loads(worker("check", "--json", **settings).stdout)
    migrate = worker("migrate", **settings)

    assert [line for line in check.stdout.splitlines() if line.startswith("warn")] == [
        f"warn  {note}" for note in notes
    ]
    assert check.stdout.splitlines()[-1] == "not working: postgres (3 other setting warnings)"
    assert [note["note"] for note in report["notes"]] == notes
    assert [note["variable"] for note in report["notes"]] == [
        "LTM_POSTGRES_DSN",
        "LTM_CONCURRENCY",
        "LTM_CONCURENCY",
    ]
    logged = [line for line in json_lines(migrate.stderr) if line["event"] == "setting not taken as written"]
    assert [(line["level"], line["note"]) for line in logged] == [("warning", note) for note in notes]

    process = WorkerProcess(cli_env(**settings), tmp_path / "worker.log").start()
    try:
        await process.wait_for_log("starting")
        process.signal(signal.SIGTERM)
        assert await process.wait_exit() == 0
    finally:
        process.kill()
    logged = [line for line in process.lines() if line["event"] == "setting not taken as written"]
    assert [(line["variable"], line["note"]) for line in logged] == list(
        zip(["LTM_POSTGRES_DSN", "LTM_CONCURRENCY", "LTM_CONCURENCY"], notes, strict=True)
    )
    [starting] = [line for line in process.lines() if line["event"] == "starting"]
    assert starting["concurrency"] == 3


def test_a_postgres_client_key_others_may_read_is_refused_as_libpq_refuses_it(
    postgres_dsn: str, tmp_path: Path
) -> None:
    """Security review 4, N9: asyncpg used a 0666 key that psql refuses; now every command refuses it."""
    cert, key = tmp_path / "client.crt", tmp_path / "client.key"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    key.write_text("-----BEGIN PRIVATE KEY-----\n")
    key.chmod(0o644)
    dsn = f"{postgres_dsn}?sslmode=require&sslcert={cert}&sslkey={key}"
    refused = (
        f'TLS client key refused: private key file "{key}" has group or world access; file must have '
        "permissions u=rw (0600) or less if owned by the current user, or permissions u=rw,g=r (0640) or "
        "less if owned by root"
    )

    check = worker("check", LTM_POSTGRES_DSN=dsn)
    migrate = worker("migrate", LTM_POSTGRES_DSN=dsn)

    assert check.returncode == 1
    assert check.stdout.splitlines()[1].strip() == refused
    (line,) = json_lines(migrate.stderr)
    assert (migrate.returncode, line["event"], line["error"]) == (1, "Postgres client key refused", refused)

    key.chmod(0o600)  # what libpq takes; the connection is then tried (and this server's answer is its own)
    assert refused not in worker("check", LTM_POSTGRES_DSN=dsn).stdout
