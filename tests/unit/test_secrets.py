"""Secrets in every form the client libraries take are never shown, a URL that can never work is named
without its value, and secrets may come from files (``*_FILE``)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from worker.config import Limits, Settings, SettingsError, connection_problems, declared, load_settings
from worker.faults import ClientKeyRefused, explain, needs_a_person
from worker.redact import describe, redact_setting, redact_url
from worker.store.pool import client_key_problem, connect_once

SECRET = "S3cret"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # userinfo
        ("postgresql://postgres:S3cret@127.0.0.1:5432/db", "postgresql://postgres:***@127.0.0.1:5432/db"),
        ("amqp://guest:S3cret@127.0.0.1:5672/", "amqp://guest:***@127.0.0.1:5672/"),
        ("amqps://w:S3cret@rmq:5671/ltm?cafile=/ca.pem", "amqps://w:***@rmq:5671/ltm?cafile=/ca.pem"),
        ("redis://:S3cret@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("rediss://default:S3cret@r:6380/0", "rediss://default:***@r:6380/0"),
        ("postgresql://u:S3cret%2F1@h/db", "postgresql://u:***@h/db"),
        # libpq multi-host, several AMQP nodes
        ("postgresql://u:S3cret@pg-a,pg-b:5433/db", "postgresql://u:***@pg-a,pg-b:5433/db"),
        ("amqp://w:S3cret@a/ltm, amqp://w:S3cret@b/ltm", "amqp://w:***@a/ltm, amqp://w:***@b/ltm"),
        # the ?password= forms (libpq, redis-py), libpq's sslpassword, among other parameters
        ("postgresql://postgres@h:5432/db?password=S3cret", "postgresql://postgres@h:5432/db?password=***"),
        (
            "postgresql://u@h/db?sslmode=require&password=S3cret&x=1",
            "postgresql://u@h/db?sslmode=require&password=***&x=1",
        ),
        ("postgresql://u@h/db?sslpassword=S3cret", "postgresql://u@h/db?sslpassword=***"),
        ("redis://h:6379/0?password=S3cret", "redis://h:6379/0?password=***"),
        ("redis://h:6379/0?db=1&PASSWORD=S3cret", "redis://h:6379/0?db=1&PASSWORD=***"),
        ("amqp://a/?password=S3cret,amqp://b/", "amqp://a/?password=***,amqp://b/"),
        # unencoded / # @ ? : , in the password: hidden whole (up to the last @)
        ("postgresql://postgres:S3c/ret@h:5432/db", "postgresql://postgres:***@h:5432/db"),
        ("postgresql://postgres:S3c#ret@h:5432/db", "postgresql://postgres:***@h:5432/db"),
        ("postgresql://postgres:S3c@ret@h:5432/db", "postgresql://postgres:***@h:5432/db"),
        ("amqp://guest:S3c?ret@h:5672/", "amqp://guest:***@h:5672/"),
        ("amqp://guest:12/S3cret@h:5672/", "amqp://guest:***@h:5672/"),
        ("amqp://guest:S3c:ret@h/", "amqp://guest:***@h/"),
        ("amqp://guest:S3c,ret@h/", "amqp://guest:***@h/"),
        ("amqp://guest:S3c://ret@h/", "amqp://guest:***@h/"),
        ("redis://:S3c/r#e@t@h:6379/0", "redis://:***@h:6379/0"),
        ("postgresql://u@h/db?password=S3c#ret", "postgresql://u@h/db?password=***"),
        ("postgresql://u@h/db?password=S3c/r@et", "postgresql://u@h/db?password=***"),
        # libpq keyword strings (asyncpg refuses them: they are still never echoed)
        ("host=h user=u password=S3cret dbname=db", "host=h user=u password=*** dbname=db"),
        ("host=h password = 'S3c ret' dbname=db", "host=h password = *** dbname=db"),
        ("password='S3c\\' ret' host=h", "password=*** host=h"),
        # text quoting a URL (an error message)
        ("cannot reach amqp://w:S3cret@h:1/ (refused)", "cannot reach amqp://w:***@h:1/ (refused)"),
        ("dsn='postgresql://u:S3cret@h/db' failed", "dsn='postgresql://u:***@h/db' failed"),
        # nothing to hide
        ("postgresql://postgres@127.0.0.1:5432/postgres", "postgresql://postgres@127.0.0.1:5432/postgres"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("unix:///run/redis.sock?db=1", "unix:///run/redis.sock?db=1"),
        ("Connection refused", "Connection refused"),
    ],
)
def test_every_form_of_a_password_is_redacted(text: str, shown: str) -> None:
    redacted = redact_url(text)

    assert redacted == shown
    assert "S3c" not in redacted
    assert "ret" not in redacted.replace("refused", "")
    assert redact_url(redacted) == redacted  # redacting twice changes nothing


def test_an_exception_is_described_without_the_password_it_quotes() -> None:
    error = ValueError("could not open postgresql://u:S3cret@h/db?sslpassword=S3cret")

    assert describe(error) == "ValueError: could not open postgresql://u:***@h/db?sslpassword=***"


PG = "LTM_POSTGRES_DSN"
AMQP = "LTM_RABBITMQ_URL"
REDIS = "LTM_REDIS_URL"


@pytest.mark.parametrize(
    ("var", "value", "reason"),
    [
        (PG, "postgresql://postgres:S3c/ret@127.0.0.1:5432/db", "a port that is not a number"),
        (PG, "postgresql://postgres:S3c#ret@127.0.0.1:5432/db", "it holds a `#`"),
        (PG, "postgresql://postgres:S3c@ret@127.0.0.1:5432/db", "more than one `@` before the host"),
        (PG, "postgresql://postgres:S3cret@a:5432,b:S3c/db", "a port that is not a number"),
        (PG, "postgresql://postgres:123/S3cret@h/db", "an `@` after the host"),
        (PG, "postgresql://postgres:S3c?ret@h/db", "a port that is not a number"),
        (PG, "postgresql://postgres:12?S3cret@h/db", "an `@` after the host"),
        (PG, "host=h user=u password=S3cret", "a libpq keyword string"),
        (PG, "mysql://u:S3cret@h/db", "the scheme is not postgresql:// or postgres://"),
        (AMQP, "amqp://guest:S3c/ret@127.0.0.1:5672/", "a port that is not a number"),
        (AMQP, "amqp://guest:S3c#ret@127.0.0.1:5672/", "it holds a `#`"),
        (AMQP, "amqp://guest:S3c,ret@127.0.0.1:5672/", "a port that is not a number"),
        (AMQP, "amqp://g:1,S3cret@h/", "not a URL"),
        (AMQP, "amqp://g:p@a/,amqp://g:S3c/ret@b/", "a port that is not a number"),
        (AMQP, " , ", "no URL given"),
        (AMQP, "guest:S3cret@h:5672", "not a URL"),
        (REDIS, "redis://:S3c/ret@127.0.0.1:6379/0", "a port that is not a number"),
        (REDIS, "redis://:S3c#ret@127.0.0.1:6379/0", "it holds a `#`"),
        (REDIS, "redis://h:6379/0?password=S3c#ret", "it holds a `#`"),
        (REDIS, "http://:S3cret@h/", "the scheme is not redis:// or rediss:// or unix://"),
    ],
)
def test_a_url_that_can_never_work_is_named_without_its_value(var: str, value: str, reason: str) -> None:
    settings = load_settings({var: value})
    problems = connection_problems(settings)

    [(field, problem)] = problems.items()
    assert problem.startswith(f"{var} is not a valid connection URL: {reason}"), problem
    assert "S3c" not in problem
    assert "\n" not in problem
    assert next(s.var for s in declared() if s.path[-1] == field) == var


@pytest.mark.parametrize(
    ("var", "value"),
    [
        (PG, "postgresql://postgres:S3cret@127.0.0.1:5432/db?sslmode=verify-full&sslrootcert=/ca.pem"),
        (PG, "postgresql://u:S3c%2Fr%23e%40t@[::1]:5432,pg-b/db?target_session_attrs=read-write"),
        (PG, "postgres:///db?host=/run/postgresql&password=S3cret"),
        (PG, "postgresql://u@h/db?application_name=a@b"),
        (AMQP, "amqp://w:S3cret@rmq-1:5672/ltm, amqps://w:S3cret@rmq-2:5671/ltm?cafile=/ca.pem"),
        (AMQP, "amqp://guest:guest@127.0.0.1/"),
        (REDIS, "rediss://:S3cret@r:6380/0?ssl_ca_certs=/ca.pem"),
        (REDIS, "redis://h/0?password=S3c%23ret"),
        (REDIS, "unix:///run/redis.sock?db=1"),
    ],
)
def test_a_url_the_libraries_take_is_not_refused(var: str, value: str) -> None:
    assert connection_problems(load_settings({var: value})) == {}


def test_the_defaults_are_valid_urls() -> None:
    assert connection_problems(Settings()) == {}


# --- secrets from files -------------------------------------------------------------------------------


@pytest.mark.parametrize("ending", ["", "\n", "\r\n", "\n\n"])
def test_a_secret_is_read_from_the_file_its_file_variable_names(tmp_path: Path, ending: str) -> None:
    files = {}
    values = {
        PG: "postgresql://ltm:S3cret@pg:5432/bot",
        AMQP: "amqp://w:S3cret@rmq/ltm",
        REDIS: "redis://:S3cret@redis:6379/0",
    }
    for var, value in values.items():
        path = tmp_path / var.lower()
        path.write_text(value + ending, encoding="utf-8")
        files[f"{var}_FILE"] = str(path)

    settings = load_settings(files)

    assert (settings.postgres_dsn, settings.rabbitmq_url, settings.redis_url) == tuple(values.values())
    assert settings.from_files == (PG, AMQP, REDIS)
    assert settings.fallbacks == ()


def test_an_empty_file_variable_is_unset(tmp_path: Path) -> None:
    settings = load_settings({PG: "postgresql://u@h/db", f"{PG}_FILE": ""})

    assert (settings.postgres_dsn, settings.from_files) == ("postgresql://u@h/db", ())


def test_both_forms_set_is_an_error_naming_both(tmp_path: Path) -> None:
    path = tmp_path / "dsn"
    path.write_text("postgresql://u:S3cret@h/db\n")

    with pytest.raises(SettingsError) as raised:
        load_settings({PG: "postgresql://u:S3cret@h/db", f"{PG}_FILE": str(path)})

    assert str(raised.value).startswith(f"{PG} and {PG}_FILE are both set: set only one")
    assert SECRET not in str(raised.value)


@pytest.mark.parametrize("content", [None, "", "\n", b"\xff\xfe"])
def test_a_file_that_cannot_give_a_value_is_an_error_naming_it(
    tmp_path: Path, content: str | bytes | None
) -> None:
    path = tmp_path / "missing" if content is None else tmp_path / "url"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)

    with pytest.raises(SettingsError) as raised:
        load_settings({f"{AMQP}_FILE": str(path)})

    assert str(raised.value).startswith(f"{AMQP}_FILE: ")
    assert str(path) in str(raised.value)


def test_a_malformed_url_from_a_file_names_the_file_variable(tmp_path: Path) -> None:
    path = tmp_path / "url"
    path.write_text("redis://:S3c/ret@h:6379/0\n")

    problems = connection_problems(load_settings({f"{REDIS}_FILE": str(path)}))

    assert problems["redis_url"].startswith(f"{REDIS} (read from {REDIS}_FILE) is not a valid connection URL")
    assert "S3c" not in problems["redis_url"]


def test_only_the_connection_settings_take_a_file() -> None:
    assert [s.var for s in declared() if s.env.file] == [PG, AMQP, REDIS]


def test_the_bench_gives_its_workers_its_own_services_whichever_form_the_operator_used() -> None:
    from bench.fleet import worker_environment

    operator = {f"{var}_FILE": f"/run/secrets/{var}" for var in (PG, AMQP, REDIS)} | {"LTM_TRACING": "off"}
    env = worker_environment(
        operator,
        Settings(),
        postgres_dsn="postgresql://b/db",
        rabbitmq_url="amqp://b/",
        redis_url="redis://b/0",
    )

    settings = load_settings(env)  # both forms at once would be an error
    assert (settings.postgres_dsn, settings.rabbitmq_url, settings.redis_url) == (
        "postgresql://b/db",
        "amqp://b/",
        "redis://b/0",
    )
    assert settings.from_files == ()


def test_the_bench_gives_its_workers_its_own_settings_quiet_and_without_a_port() -> None:
    from bench.fleet import worker_environment

    bench = Settings(prefetch=7, limits=Limits(max_server_memories=10**8), tracing="console", http_port=9109)
    env = worker_environment({"HOME": "/home/b"}, bench, postgres_dsn="postgresql://127.0.0.1/db")

    settings = load_settings(env)
    quiet = {"log_level": "warning", "log_format": "json", "http_port": 0}
    assert settings == bench.model_copy(update={"postgres_dsn": "postgresql://127.0.0.1/db", **quiet})
    assert (env["HOME"], env["PYTHONUNBUFFERED"]) == ("/home/b", "1")


# --- what a secret file may be (security review 4, N8) ------------------------------------------------------


def refusal_of(path: str) -> str:
    with pytest.raises(SettingsError) as raised:
        load_settings({f"{REDIS}_FILE": path})
    return str(raised.value)


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda d: (os.mkfifo(d / "fifo"), d / "fifo")[1], "a FIFO"),  # used to block `worker check`
        (lambda d: Path("/dev/zero"), "a character device"),  # used to fill the memory
        (lambda d: d, "a directory"),
    ],
    ids=["fifo", "dev-zero", "directory"],
)
def test_a_secret_file_must_be_a_regular_file(tmp_path: Path, make: Any, kind: str) -> None:
    path = make(tmp_path)

    assert refusal_of(str(path)) == (
        f"{REDIS}_FILE: {path} is {kind}, not a regular file: name the file that holds the value"
    )


def test_a_secret_file_over_64_kib_is_refused_without_being_echoed(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_text("redis://:" + SECRET * 11_000 + "@h/0")

    said = refusal_of(str(path))

    assert said == (
        f"{REDIS}_FILE: {path} is larger than 64 KiB; a secret file holds one connection URL: is it the "
        "right file?"
    )
    assert SECRET not in said


def test_a_secret_file_through_a_symlink_is_read_as_kubernetes_mounts_it(tmp_path: Path) -> None:
    (tmp_path / "..data").mkdir()
    (tmp_path / "..data" / "url").write_text("redis://:S3cret@redis:6379/0\n")
    (tmp_path / "url").symlink_to(tmp_path / "..data" / "url")
    exactly = tmp_path / "exactly"
    exactly.write_text("redis://h/0?x=" + "a" * (64 * 1024 - len("redis://h/0?x=")))

    assert load_settings({f"{REDIS}_FILE": str(tmp_path / "url")}).redis_url == "redis://:S3cret@redis:6379/0"
    assert len(load_settings({f"{REDIS}_FILE": str(exactly)}).redis_url) == 64 * 1024


# --- a setting that is no URL is not shown (security review 4, N6) ----------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "S3cretOnlyPassw0rd",
        "root:$6$S3cretHASH:19000:0:99999:7:::",
        "amqp//u:S3cretB@127.0.0.1:5672/",
        "u:S3cretA@127.0.0.1:5672/",
        "amqp:/u:S3cretC@127.0.0.1/",
        "host=h user=u password=S3cret",
        "",
    ],
)
def test_a_setting_that_is_no_url_shows_only_its_length(value: str) -> None:
    assert redact_setting(value) == f"<unreadable, {len(value)} characters>"


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("postgresql://u:S3cret@pg-a,pg-b/db", "postgresql://u:***@pg-a,pg-b/db"),
        ("amqp://w:S3cret@a/, amqp://w:S3cret@b/", "amqp://w:***@a/, amqp://w:***@b/"),
        ("amqp://w:S3cret@a/,oops:S3cret@b/", "amqp://w:***@b/"),
        ("postgressql://u:S3cret@h/db", "postgressql://u:***@h/db"),
    ],
)
def test_a_setting_that_begins_as_a_url_is_shown_redacted(value: str, shown: str) -> None:
    assert redact_setting(value) == shown


# --- a Postgres client key libpq would refuse (security review 4, N9) ---------------------------------------


def key_pair(directory: Path, mode: int) -> tuple[Path, Path]:
    cert, key = directory / "client.crt", directory / "client.key"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    key.write_text("-----BEGIN PRIVATE KEY-----\n")
    key.chmod(mode)
    return cert, key


def dsn_with(cert: Path, key: Path, sslmode: str = "require") -> str:
    return f"postgresql://u@pg.example/db?sslmode={sslmode}&sslcert={cert}&sslkey={key}"


LIBPQ = (
    'private key file "{key}" has group or world access; file must have permissions u=rw (0600) or less if '
    "owned by the current user, or permissions u=rw,g=r (0640) or less if owned by root"
)


@pytest.mark.parametrize("mode", [0o644, 0o666, 0o604, 0o660, 0o640])
def test_a_client_key_others_may_read_is_refused_with_libpqs_words(tmp_path: Path, mode: int) -> None:
    cert, key = key_pair(tmp_path, mode)
    if os.geteuid() == 0:
        os.chown(key, 65534, -1)  # not root's: the 0600 rule

    assert client_key_problem(dsn_with(cert, key), {}) == LIBPQ.format(key=key)
    with pytest.raises(ClientKeyRefused) as raised:
        asyncio.run(connect_once(dsn_with(cert, key), timeout=1))
    said = explain(raised.value)
    assert said == "TLS client key refused: " + LIBPQ.format(key=key)
    assert needs_a_person(said)


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o700])
def test_a_client_key_only_its_owner_reads_is_used(tmp_path: Path, mode: int) -> None:
    cert, key = key_pair(tmp_path, mode)

    assert client_key_problem(dsn_with(cert, key), {}) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="a file owned by root needs root to make")
def test_a_root_owned_client_key_may_be_group_readable_as_a_mounted_secret_is(tmp_path: Path) -> None:
    cert, key = key_pair(tmp_path, 0o440)  # a Kubernetes Secret's defaultMode in deploy/k8s

    assert client_key_problem(dsn_with(cert, key), {}) is None
    key.chmod(0o660)
    assert client_key_problem(dsn_with(cert, key), {}) == LIBPQ.format(key=key)


def test_a_client_key_is_judged_only_where_asyncpg_would_use_it(tmp_path: Path) -> None:
    cert, key = key_pair(tmp_path, 0o666)
    if os.geteuid() == 0:
        os.chown(key, 65534, -1)
    home = {"HOME": str(tmp_path / "nohome")}

    assert client_key_problem(dsn_with(cert, key, "disable"), {}) is None
    assert client_key_problem(f"postgresql://u@h/db?sslkey={key}", home) is None  # no certificate
    assert client_key_problem(dsn_with(tmp_path / "absent.crt", key), {}) is None
    assert client_key_problem(f"postgresql://u@h/db?sslcert={cert}", {"PGSSLKEY": str(key)}) is not None
    assert client_key_problem(dsn_with(cert, key), {"PGSSLMODE": "disable"}) is not None  # the DSN says
