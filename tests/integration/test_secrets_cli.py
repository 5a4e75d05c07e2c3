"""Secrets in every form, through the commands an operator runs (real processes, real services): ``worker
check`` (text and JSON), ``migrate``, ``dlq list`` and ``run`` never print a password or a piece of one, a URL
that can never work is one line naming its variable, and secrets can come from ``*_FILE`` files."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import pytest

from tests.integration.test_cli import cli_env, json_lines, worker
from tests.services import Services
from tests.support.harness import REPO, WorkerProcess
from worker.testing.management import FULL_PERMISSIONS, ManagementApi
from worker.testing.workers import free_port

pytestmark = pytest.mark.integration

#: every piece of it is looked for in the output: a prefix before an unencoded character is a leak too
SECRET = "S3cQx9"
PIECES = ("S3cQ", "Qx9")


def assert_no_secret(done: subprocess.CompletedProcess[str]) -> str:
    output = done.stdout + done.stderr
    for piece in PIECES:
        assert piece not in output, output
    assert "Traceback" not in output, output
    return output


def with_netloc(url: str, netloc: str) -> str:
    return urlunsplit(urlsplit(url)._replace(netloc=netloc))


def userinfo(url: str, password: str) -> str:
    """``url`` with ``password`` written into its userinfo as given (not encoded)."""
    parts = urlsplit(url)
    rest = url.split(parts.netloc, 1)[1]
    return f"{parts.scheme}://{parts.username or ''}:{password}@{parts.hostname}:{parts.port}{rest}"


UNENCODED = {"slash": f"S3cQ/x9{SECRET}", "hash": f"S3cQ#x9{SECRET}", "at": f"S3cQ@x9{SECRET}"}


# --- check, migrate: the ?password= forms and the userinfo forms, working ----------------------------


def test_check_shows_no_password_of_working_urls_in_every_form(
    migrated_dsn: str, rabbitmq_url: str, redis_url: str
) -> None:
    """Trust auth on the shared Postgres and no requirepass on the shared Redis: the URLs work whatever the
    password, so the report is all ``ok`` and each target shows ``***`` where the password was. A Postgres
    that checks passwords (a container) gets its real one in the userinfo form, which must not show either."""
    services = {
        "LTM_POSTGRES_DSN": f"{migrated_dsn}?password={SECRET}",
        "LTM_RABBITMQ_URL": rabbitmq_url,
        "LTM_REDIS_URL": f"{redis_url}?db=0&password={SECRET}"
        if "?" not in redis_url
        else f"{redis_url}&password={SECRET}",
    }
    for args in (("check",), ("check", "--json")):
        done = worker(*args, **services)
        output = assert_no_secret(done)
        assert done.returncode == 0, output
    report = json.loads(done.stdout)
    assert report["dependencies"]["postgres"]["target"].endswith("?password=***")
    assert report["dependencies"]["redis"]["target"].endswith("password=***")

    password = urlsplit(migrated_dsn).password or SECRET
    done = worker("check", **{**services, "LTM_POSTGRES_DSN": userinfo(migrated_dsn, password)})
    assert_no_secret(done)
    assert password not in done.stdout + done.stderr
    assert done.returncode == 0, done.stdout
    assert ":***@" in done.stdout


def test_migrate_logs_no_password_in_the_query_form(migrated_dsn: str) -> None:
    done = worker("migrate", LTM_POSTGRES_DSN=f"{migrated_dsn}?password={SECRET}")
    assert_no_secret(done)
    assert done.returncode == 0

    unreachable = with_netloc(f"{migrated_dsn}?sslmode=disable&password={SECRET}", "postgres@127.0.0.1:1")
    done = worker("migrate", LTM_POSTGRES_DSN=unreachable)
    assert_no_secret(done)
    (line,) = json_lines(done.stderr)
    assert (done.returncode, line["event"]) == (1, "cannot reach Postgres")
    assert line["dsn"].endswith("?sslmode=disable&password=***")


def test_a_keyword_dsn_is_refused_without_being_echoed() -> None:
    dsn = f"host=127.0.0.1 user=postgres password={SECRET} dbname=postgres"
    done = worker("migrate", LTM_POSTGRES_DSN=dsn)
    assert_no_secret(done)
    (line,) = json_lines(done.stderr)
    assert line["error"].startswith("LTM_POSTGRES_DSN is not a valid connection URL: a libpq keyword string")
    assert line["dsn"] == f"<unreadable, {len(dsn)} characters>"


# --- unencoded characters: one line naming the variable, never a piece of the password ----------------


@pytest.mark.parametrize("char", sorted(UNENCODED))
def test_an_unencoded_character_in_a_password_is_one_line_in_every_command(
    char: str, postgres_dsn: str, rabbitmq_url: str, redis_url: str
) -> None:
    password = UNENCODED[char]
    urls = {
        "LTM_POSTGRES_DSN": userinfo(postgres_dsn, password),
        "LTM_RABBITMQ_URL": userinfo(rabbitmq_url, password),
        "LTM_REDIS_URL": userinfo(redis_url, password),
    }

    check = worker("check", **urls)
    assert_no_secret(check)
    assert check.returncode == 1
    lines = check.stdout.splitlines()
    for n, var in enumerate(urls):
        assert lines[2 * n].startswith("FAIL"), check.stdout
        assert lines[2 * n + 1].strip().startswith(f"{var} is not a valid connection URL: "), check.stdout
    report = worker("check", "--json", **urls)
    assert_no_secret(report)
    assert {name: d["ok"] for name, d in json.loads(report.stdout)["dependencies"].items()} == {
        "postgres": False,
        "rabbitmq": False,
        "redis": False,
    }

    migrate = worker("migrate", LTM_POSTGRES_DSN=urls["LTM_POSTGRES_DSN"])
    assert_no_secret(migrate)
    (line,) = json_lines(migrate.stderr)
    assert (migrate.returncode, line["event"]) == (1, "invalid Postgres connection string")
    assert line["error"].startswith("LTM_POSTGRES_DSN is not a valid connection URL: ")

    listed = worker("dlq", "list", LTM_RABBITMQ_URL=urls["LTM_RABBITMQ_URL"])
    assert_no_secret(listed)
    assert listed.returncode == 2  # a setting that can never work: "bad options"
    assert listed.stdout == ""
    assert listed.stderr.startswith("worker dlq: LTM_RABBITMQ_URL is not a valid connection URL: ")
    assert len(listed.stderr.splitlines()) == 1


@pytest.mark.parametrize("var", ["LTM_POSTGRES_DSN", "LTM_RABBITMQ_URL", "LTM_REDIS_URL"])
def test_run_exits_at_once_on_a_url_that_can_never_work(
    var: str, postgres_dsn: str, rabbitmq_url: str, redis_url: str
) -> None:
    """Before: an AMQP URL like this was retried for ever (``rabbitmq unavailable``)."""
    urls = {"LTM_POSTGRES_DSN": postgres_dsn, "LTM_RABBITMQ_URL": rabbitmq_url, "LTM_REDIS_URL": redis_url}
    urls[var] = userinfo(urls[var], UNENCODED["slash"])
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "worker", "run"],
        cwd=REPO,
        env=cli_env(**urls),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert_no_secret(done)
    assert done.returncode == 1
    (line,) = [line for line in json_lines(done.stderr) if line["level"] == "error"]
    assert line["event"] == "cannot start"
    assert line["error"].startswith(f"{var} is not a valid connection URL: a port that is not")
    assert "unavailable" not in done.stderr
    assert "waiting for dependency" not in done.stderr
    print(f"worker run exited {done.returncode} after {time.monotonic() - started:.1f} s")


async def test_run_logs_no_password_at_debug(
    migrated_dsn: str, rabbitmq_url: str, redis_url: str, tmp_path: Path
) -> None:
    """Every form at once, at the most talkative level, through start-up, a dependency wait and a stop."""
    # the first node refuses (a closed port), the second is the one consumed
    refusing = with_netloc(rabbitmq_url, f"guest:{SECRET}@127.0.0.1:{free_port()}")
    env = cli_env(
        LTM_POSTGRES_DSN=f"{migrated_dsn}?password={SECRET}",
        LTM_RABBITMQ_URL=f"{refusing},{rabbitmq_url}",
        LTM_REDIS_URL=f"{redis_url}?password={SECRET}"
        if "?" not in redis_url
        else f"{redis_url}&password={SECRET}",
        LTM_LOG_LEVEL="debug",
    )
    process = WorkerProcess(env, tmp_path / "worker.log").start()
    try:
        await process.wait_for_log("consuming")
        process.signal(signal.SIGTERM)
        assert await process.wait_exit() == 0
    finally:
        process.kill()

    text = process.log_path.read_text()
    for piece in PIECES:
        assert piece not in text
    assert "Traceback" not in text


# --- a real password with every special character, percent-encoded, works -----------------------------


@pytest.fixture
def special_user(rabbitmq_url: str, test_services: Services) -> Iterator[tuple[str, str]]:
    """A RabbitMQ user of the test's vhost whose password holds ``/ ? # @ : ,``; deleted after. Made through
    the management API when the broker has one (a container), else with ``rabbitmqctl`` on this machine."""
    user = f"ltm_secret_{uuid.uuid4().hex[:10]}"
    password = f"S3cQ/?#@:,x9{SECRET}"
    vhost = unquote(urlsplit(rabbitmq_url).path[1:])
    admin = test_services.broker_admin()

    if isinstance(admin, ManagementApi):
        admin.put_user(user, password)
        try:
            admin.set_permissions(vhost, user, FULL_PERMISSIONS)
            yield user, password
        finally:
            admin.delete_user(user)
        return

    def ctl(*args: str) -> None:
        subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)

    ctl("add_user", user, password)
    try:
        ctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
        yield user, password
    finally:
        ctl("delete_user", user)


def test_a_percent_encoded_password_with_every_special_character_works(
    rabbitmq_url: str, special_user: tuple[str, str]
) -> None:
    user, password = special_user
    address = urlsplit(rabbitmq_url).netloc.rpartition("@")[2]
    encoded = with_netloc(rabbitmq_url, f"{user}:{quote(password, safe='')}@{address}")

    done = worker("check", "--json", LTM_RABBITMQ_URL=encoded)
    assert_no_secret(done)
    rabbitmq = json.loads(done.stdout)["dependencies"]["rabbitmq"]
    assert rabbitmq["ok"] is True, rabbitmq
    assert rabbitmq["target"].startswith(f"amqp://{user}:***@{address}")

    listed = worker("dlq", "list", LTM_RABBITMQ_URL=encoded)
    assert_no_secret(listed)
    assert listed.returncode == 4, listed.stderr  # reached the vhost: its DLQ is not declared yet

    wrong = with_netloc(rabbitmq_url, f"{user}:{quote(password[::-1], safe='')}@{address}")
    refused = worker("dlq", "list", LTM_RABBITMQ_URL=wrong)
    assert_no_secret(refused)
    assert refused.returncode == 3
    assert len(refused.stderr.splitlines()) == 1


# --- secrets from files --------------------------------------------------------------------------------


def test_check_and_migrate_read_secrets_from_files(
    migrated_dsn: str, rabbitmq_url: str, redis_url: str, tmp_path: Path
) -> None:
    files = {}
    for var, value in {
        "LTM_POSTGRES_DSN": f"{migrated_dsn}?password={SECRET}",
        "LTM_RABBITMQ_URL": rabbitmq_url,
        "LTM_REDIS_URL": redis_url,
    }.items():
        path = tmp_path / var.lower()
        path.write_text(value + "\n")  # as `echo ... > file` or a Kubernetes Secret written with one
        files[f"{var}_FILE"] = str(path)

    done = worker("check", "--json", **files)
    assert_no_secret(done)
    report = json.loads(done.stdout)
    assert report["ok"] is True, report
    assert report["dependencies"]["postgres"]["target"].endswith("?password=***")
    migrated = worker("migrate", **files)
    assert_no_secret(migrated)
    assert migrated.returncode == 0

    # a command-line option overrides the file, like it overrides the variable
    overridden = worker("check", "--redis-url", "redis://127.0.0.1:1/0", **files)
    assert overridden.returncode == 1
    assert "FAIL  redis     redis://127.0.0.1:1/0" in overridden.stdout


@pytest.mark.parametrize(("command", "code"), [("check", 1), ("migrate", 1), ("run", 1), ("dlq", 2)])
def test_a_secret_set_twice_is_one_line_naming_both_variables(
    command: str, code: int, tmp_path: Path
) -> None:
    path = tmp_path / "url"
    path.write_text(f"amqp://guest:{SECRET}@127.0.0.1:5672/\n")
    args = (command, "list") if command == "dlq" else (command,)

    done = worker(
        *args, LTM_RABBITMQ_URL=f"amqp://guest:{SECRET}@127.0.0.1:5672/", LTM_RABBITMQ_URL_FILE=str(path)
    )

    assert_no_secret(done)
    assert done.returncode == code
    assert done.stderr == (
        f"worker {command}: LTM_RABBITMQ_URL and LTM_RABBITMQ_URL_FILE are both set: set only one "
        "(LTM_RABBITMQ_URL_FILE names a file holding the value)\n"
    )


def test_a_missing_secret_file_is_named_with_its_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "dsn"
    done = worker("check", "--json", LTM_POSTGRES_DSN_FILE=str(missing))

    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["ok"] is False
    assert report["error"] == f"LTM_POSTGRES_DSN_FILE: cannot read {missing}: No such file or directory"


# --- a Redis that asks for the password: every form authenticates, none is shown ----------------------


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[int]:
    """A private ``redis-server`` on a free loopback port with ``requirepass``; stopped by its PID."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("needs redis-server")
    port = free_port()
    options = ["--port", str(port), "--bind", "127.0.0.1", "--requirepass", REDIS_PASSWORD]
    options += ["--save", "", "--appendonly", "no", "--dir", str(tmp_path)]
    process = subprocess.Popen(
        [server, *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            assert process.poll() is None, "redis-server exited"
            assert time.monotonic() < deadline, "redis-server did not listen"
            time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=30)


#: percent-encoded where a URL needs it
REDIS_PASSWORD = f"S3cQ/#@?x9{SECRET}"


def test_every_redis_password_form_authenticates_and_none_is_shown(
    private_redis: int, migrated_dsn: str, rabbitmq_url: str
) -> None:
    encoded = quote(REDIS_PASSWORD, safe="")
    services = {"LTM_POSTGRES_DSN": migrated_dsn, "LTM_RABBITMQ_URL": rabbitmq_url}
    for url in (
        f"redis://:{encoded}@127.0.0.1:{private_redis}/0",
        f"redis://default:{encoded}@127.0.0.1:{private_redis}/0",
        f"redis://127.0.0.1:{private_redis}/0?password={encoded}",
    ):
        done = worker("check", "--json", **services, LTM_REDIS_URL=url)
        assert_no_secret(done)
        redis = json.loads(done.stdout)["dependencies"]["redis"]
        assert redis["ok"] is True, redis
        assert "***" in redis["target"]

    wrong = worker(
        "check", **services, LTM_REDIS_URL=f"redis://127.0.0.1:{private_redis}/0?password={SECRET}wrong"
    )
    assert_no_secret(wrong)
    assert wrong.returncode == 1
    assert re.search(r"^FAIL\s+redis\s+redis://127\.0\.0\.1:\d+/0\?password=\*\*\*$", wrong.stdout, re.M)


async def test_run_consumes_with_every_secret_from_a_file(
    migrated_dsn: str, rabbitmq_url: str, redis_url: str, tmp_path: Path
) -> None:
    """What the Kubernetes manifests do: only the *_FILE variables, the Secret's keys as files."""
    env = cli_env()
    for var, value in {
        "LTM_POSTGRES_DSN": f"{migrated_dsn}?password={SECRET}",
        "LTM_RABBITMQ_URL": rabbitmq_url,
        "LTM_REDIS_URL": redis_url,
    }.items():
        path = tmp_path / var
        path.write_text(value)  # as the kubelet writes a Secret's key: no line break
        env[f"{var}_FILE"] = str(path)
    process = WorkerProcess(env, tmp_path / "worker.log").start()
    try:
        await process.wait_for_log("consuming")
        process.signal(signal.SIGTERM)
        assert await process.wait_exit() == 0
    finally:
        process.kill()

    text = process.log_path.read_text()
    assert SECRET not in text
    assert "Traceback" not in text


# --- a setting that is no URL is never shown; what a secret file may be (security review 4, N6, N8) --------


NOT_URLS = {
    "no-colon": f"amqp//u:{SECRET}@127.0.0.1:5672/",
    "no-scheme": f"u:{SECRET}@127.0.0.1:5672/",
    "one-slash": f"amqp:/u:{SECRET}@127.0.0.1/",
}


@pytest.mark.parametrize("form", sorted(NOT_URLS))
def test_a_connection_setting_that_is_no_url_shows_only_its_length_in_every_command(
    form: str, postgres_dsn: str, rabbitmq_url: str, redis_url: str
) -> None:
    value = NOT_URLS[form]
    shown = f"<unreadable, {len(value)} characters>"
    services = {"LTM_POSTGRES_DSN": postgres_dsn, "LTM_RABBITMQ_URL": value, "LTM_REDIS_URL": redis_url}

    check = worker("check", **services)
    report = worker("check", "--json", **services)
    migrate = worker("migrate", LTM_POSTGRES_DSN=value.replace("amqp", "postgres"))
    run = subprocess.run(
        [sys.executable, "-m", "worker", "run"],
        cwd=REPO,
        env=cli_env(**services),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    for done in (check, report, migrate, run):
        assert_no_secret(done)
    assert f"FAIL  rabbitmq  {shown}\n" in check.stdout
    assert json.loads(report.stdout)["dependencies"]["rabbitmq"]["target"] == shown
    assert (
        json_lines(migrate.stderr)[-1]["dsn"]
        == f"<unreadable, {len(value.replace('amqp', 'postgres'))} characters>"
    )
    [starting] = [line for line in json_lines(run.stderr) if line["event"] == "starting"]
    assert (starting["level"], starting["rabbitmq"], run.returncode) == ("info", shown, 1)


@pytest.mark.parametrize("content", [SECRET, f"root:$6${SECRET}:19000:0:99999:7:::\nbin:x:1:1::/:/bin/sh"])
def test_the_wrong_file_as_a_secret_is_never_echoed(content: str, tmp_path: Path, postgres_dsn: str) -> None:
    target = tmp_path / "shadow"
    target.write_text(content)
    (tmp_path / "redis-url").symlink_to(target)

    done = worker("check", LTM_POSTGRES_DSN=postgres_dsn, LTM_REDIS_URL_FILE=str(tmp_path / "redis-url"))

    assert_no_secret(done)
    assert done.returncode == 1
    first_line = content.rstrip("\n")
    assert f"FAIL  redis     <unreadable, {len(first_line)} characters>\n" in done.stdout


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory", "too-large"])
def test_a_secret_file_that_is_no_small_regular_file_is_refused_at_once(kind: str, tmp_path: Path) -> None:
    """Before: a FIFO made `worker check` hang, /dev/zero filled the memory, 3 MB were echoed back."""
    path = {"fifo": tmp_path / "fifo", "dev-zero": Path("/dev/zero"), "directory": tmp_path}.get(
        kind, tmp_path / "big"
    )
    if kind == "fifo":
        os.mkfifo(path)
    if kind == "too-large":
        path.write_text(f"redis://:{SECRET}@h/0?x=" + "x" * 3_000_000)

    done = worker("check", LTM_REDIS_URL_FILE=str(path))

    assert_no_secret(done)
    assert done.returncode == 1
    assert done.stderr.startswith(f"worker check: LTM_REDIS_URL_FILE: {path} is ")
    assert len(done.stderr.splitlines()) == 1
