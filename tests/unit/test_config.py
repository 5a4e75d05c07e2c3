"""Settings that fall back: every one is recorded, with what it takes, and nothing valid is; the identity
settings are refused instead (security review 5, N-G)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from worker.config import (
    DEFAULT_HTTP_HOST,
    Settings,
    connection_problems,
    expected_value,
    load_settings,
    refused_settings,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("raw", "port", "fell_back"),
    [
        ("", 0, False),
        ("0", 0, False),
        ("  ", 0, False),
        ("8080", 8080, False),
        (" 9109 ", 9109, False),
        ("65535", 65535, False),
        ("65536", 0, True),
        ("notaport", 0, True),
        ("-1", 0, True),
        ("80abc", 0, True),
        ("²", 0, True),
    ],
)
def test_ltm_http_port_is_a_port_or_falls_back_to_off(raw: str, port: int, fell_back: bool) -> None:
    settings = load_settings({"LTM_HTTP_PORT": raw})

    assert settings.http_port == port
    assert settings.fallbacks == ((("LTM_HTTP_PORT", raw, 0),) if fell_back else ())


@pytest.mark.parametrize(
    ("var", "raw", "field", "value", "default"),
    [
        ("LTM_LOG_FORMAT", "xml", "log_format", "auto", "auto"),
        ("LTM_LOG_FORMAT", " JSON ", "log_format", "json", None),
        ("LTM_LOG_FORMAT", "", "log_format", "auto", None),
        ("LTM_LOG_LEVEL", "verbose", "log_level", "info", "info"),
        ("LTM_LOG_LEVEL", "Debug", "log_level", "debug", None),
        ("LTM_LOG_LEVEL", "warning", "log_level", "warning", None),
        ("LTM_TRACING", "jaeger", "tracing", "off", "off"),
        ("MAX_SERVER_MEMORIES", "abc", "limits", None, 100),
        ("LTM_PREFETCH", "0", "prefetch", Settings().prefetch, Settings().prefetch),
    ],
)
def test_a_value_a_setting_does_not_take_falls_back_with_a_record(
    var: str, raw: str, field: str, value: object, default: object
) -> None:
    settings = load_settings({var: raw})

    if value is not None:
        assert getattr(settings, field) == value
    assert settings.fallbacks == (((var, raw, default),) if default is not None else ())


def test_every_fallback_is_recorded_and_says_what_the_setting_takes() -> None:
    env = {
        "MAX_MEMORY_LENGTH": "long",
        "LTM_HTTP_PORT": "notaport",
        "LTM_LOG_FORMAT": "xml",
        "LTM_LOG_LEVEL": "verbose",
        "LTM_TRACING": "jaeger",
    }
    settings = load_settings(env)

    assert {var: raw for var, raw, _ in settings.fallbacks} == env
    assert expected_value("LTM_HTTP_PORT") == "a port number 0..65535 (0 or empty: off)"
    assert expected_value("LTM_LOG_FORMAT") == "one of auto, json, console"
    assert expected_value("LTM_LOG_LEVEL") == "one of debug, info, warning, error"
    assert expected_value("MAX_MEMORY_LENGTH") == "an integer > 0"


@pytest.mark.parametrize(
    ("raw", "host"), [(None, DEFAULT_HTTP_HOST), ("", DEFAULT_HTTP_HOST), ("0.0.0.0", "0.0.0.0")]
)
def test_the_probe_endpoint_listens_on_this_host_only_unless_told(raw: str | None, host: str) -> None:
    settings = load_settings({} if raw is None else {"LTM_HTTP_HOST": raw})

    assert (settings.http_host, settings.fallbacks) == (host, ())
    assert DEFAULT_HTTP_HOST == "127.0.0.1"


# --- notes: a value read other than as written, an unknown variable, a DSN without sslmode ------------------
# (newcomer review 4, F7; security review 4, N9)


@pytest.mark.parametrize(
    ("raw", "value", "note"),
    [
        ("3O", 3, "LTM_CONCURRENCY='3O' read as 3 (the text after the digits is ignored, as parseInt does)"),
        (
            "12abc",
            12,
            "LTM_CONCURRENCY='12abc' read as 12 (the text after the digits is ignored, as parseInt does)",
        ),
        (
            "1e3",
            1,
            "LTM_CONCURRENCY='1e3' read as 1 (the text after the digits is ignored, as parseInt does)",
        ),
        ("12", 12, None),
        (" 12\n", 12, None),
        ("+5", 5, None),
    ],
)
def test_an_integer_with_text_after_it_keeps_the_bots_value_but_is_noted(
    raw: str, value: int, note: str | None
) -> None:
    settings = load_settings({"LTM_CONCURRENCY": raw})

    assert settings.concurrency == value
    assert settings.fallbacks == ()
    assert settings.notes == ((("LTM_CONCURRENCY", note),) if note else ())


def test_an_unknown_ltm_variable_is_noted_with_the_setting_it_probably_meant() -> None:
    env = {
        "LTM_CONCURENCY": "4",
        "LTM_POSTGRES_DNS_FILE": "/run/secrets/S3cret",
        "LTM_FOO": "S3cret",
        "MAX_MEMORY_LENGHT": "5",
        # not settings of the worker, and not the worker's to judge
        "MAX_OPEN_FILES": "1024",
        "LTM_TEST_POSTGRES_DSN": "postgresql://u@h/db",
        "LTM_BENCH_NAGLE": "1",
        "LTM_STACK": "1",
        "LTM_STACK_WORKERS": "2",
        "LTM_DEMO_DB": "ltm_demo",
        "LTM_WORKER_IMAGE": "x",
        "LTM_POSTGRES_HOST_PORT": "45432",
        "LTM_WORKER_BIN": "/x",
        "LTM_REQUIRE_DOCKER": "1",
        "LTM_POSTGRES_DSN_FILE": "",
        "LTM_CONCURRENCY": "4",
    }

    notes = load_settings(env).notes

    assert notes == (
        ("LTM_CONCURENCY", "unknown setting LTM_CONCURENCY; did you mean LTM_CONCURRENCY?"),
        ("LTM_FOO", "unknown setting LTM_FOO: no setting reads it (`worker --help` lists them)"),
        (
            "LTM_POSTGRES_DNS_FILE",
            "unknown setting LTM_POSTGRES_DNS_FILE; did you mean LTM_POSTGRES_DSN_FILE?",
        ),
        ("MAX_MEMORY_LENGHT", "unknown setting MAX_MEMORY_LENGHT; did you mean MAX_MEMORY_LENGTH?"),
    )
    assert "S3cret" not in repr(notes)


SSL_ADVICE = (
    "the server is not verified, and without TLS on offer the connection goes on in plaintext without a "
    "word; say sslmode=verify-full (docs/tls.md), or sslmode=disable to choose plaintext in the "
    "open"
)


@pytest.mark.parametrize(
    ("dsn", "env", "said"),
    [
        ("postgresql://ltm:S3cret@192.0.2.10:5432/bot", {}, "reaches '192.0.2.10' without sslmode"),
        ("postgresql://ltm@10.0.0.7/bot?sslmode=prefer", {}, "reaches '10.0.0.7' with sslmode=prefer"),
        (
            "postgresql://ltm@[2001:db8::1]:5432/bot",
            {"PGSSLMODE": "allow"},
            "reaches '2001:db8::1' with sslmode=allow",
        ),
        ("postgresql://ltm@127.0.0.1,192.0.2.11:5433/bot", {}, "reaches '192.0.2.11' without sslmode"),
        (
            "postgresql://ltm@127.0.0.0l:5432/bot",
            {},
            None,
        ),  # a typo that resolves nowhere: its own error says so
        ("postgresql://ltm@pg.ltm-no-such-host.invalid/bot", {}, None),
        (
            "postgresql://ltm@localhost,pg.ltm-no-such-host.invalid,192.0.2.11/bot",
            {},
            "reaches '192.0.2.11' without sslmode",
        ),
        ("postgresql:///bot", {"PGHOST": "192.0.2.10"}, "reaches '192.0.2.10' without sslmode"),
        ("postgresql://ltm@192.0.2.10/bot?sslmode=verify-full&sslrootcert=/ca.pem", {}, None),
        ("postgresql://ltm@192.0.2.10/bot?sslmode=require", {}, None),
        ("postgresql://ltm@192.0.2.10/bot", {"PGSSLMODE": "verify-ca"}, None),
        ("postgresql://ltm@postgres:5432/bot?sslmode=disable", {}, None),  # compose: plaintext in the open
        ("postgresql://postgres@127.0.0.1:5432/postgres", {}, None),
        ("postgresql://ltm@localhost/bot", {}, None),
        ("postgresql://ltm@[::1]/bot", {}, None),
        ("postgres:///bot?host=/run/postgresql", {}, None),
        ("postgresql://ltm:S3c/ret@pg.example/bot", {}, None),  # refused on its own
    ],
)
def test_a_postgres_dsn_to_another_host_without_sslmode_is_noted(
    dsn: str, env: dict[str, str], said: str | None
) -> None:
    notes = load_settings({"LTM_POSTGRES_DSN": dsn, **env}).notes

    assert notes == ((("LTM_POSTGRES_DSN", f"LTM_POSTGRES_DSN {said}: {SSL_ADVICE}"),) if said else ())
    assert "S3cret" not in repr(notes)


@pytest.mark.parametrize(
    ("dsn", "advised"),
    [
        ("postgressql://u:S3cret@h/db", False),  # a misspelt scheme has nothing to do with a password
        ("postgres//u:S3cret@h/db", False),
        ("postgresql://u:S3c/ret@h/db", True),
        ("postgresql://u:S3c#ret@h/db", True),
        ("postgresql://u:S3c@ret@h/db", True),
    ],
)
def test_the_percent_encoding_advice_comes_only_where_a_password_can_be_the_cause(
    dsn: str, advised: bool
) -> None:
    [problem] = connection_problems(load_settings({"LTM_POSTGRES_DSN": dsn})).values()

    assert ("percent-encode" in problem) is advised


# --- the identity settings are refused, never fallen back on (security review 5, N-G) ------------------


@pytest.mark.parametrize(
    ("var", "raw"),
    [
        ("LTM_SHARD_IDENTITY", "requried"),
        ("LTM_SHARD_IDENTITY", "strict"),
        ("LTM_SHARD_USER", "shard-{id}"),
        ("LTM_SHARD_USER", "tomori-bot"),
        ("LTM_TRUSTED_PUBLISHERS", "operator,"),
        ("LTM_TRUSTED_PUBLISHERS", ",operator"),
        ("LTM_TRUSTED_PUBLISHERS", "operator,,replayer"),
        ("LTM_TRUSTED_PUBLISHERS", "operator, ,replayer"),
        ("LTM_TRUSTED_PUBLISHERS", "oper ator"),
        ("LTM_TRUSTED_PUBLISHERS", "operator\treplayer"),
        ("LTM_TRUSTED_PUBLISHERS", "operator,re\u200bplayer"),
        ("LTM_TRUSTED_PUBLISHERS", "o" * 256),
    ],
)
def test_an_identity_setting_given_a_value_it_does_not_take_is_refused(var: str, raw: str) -> None:
    settings = load_settings({var: raw})

    refused = refused_settings(settings)
    assert list(refused) == [var]
    assert refused[var].startswith(f"{var}={raw!r} is not {expected_value(var)}; refused: ")
    # an ordinary fallback is not refused
    assert refused_settings(load_settings({"LTM_LOG_LEVEL": "verbose"})) == {}


@pytest.mark.parametrize(
    ("var", "raw", "field", "value"),
    [
        ("LTM_SHARD_IDENTITY", " Required ", "shard_identity", "required"),
        ("LTM_SHARD_IDENTITY", "", "shard_identity", "checked"),
        ("LTM_SHARD_USER", "tomori-shard-{shard_id}", "shard_user", "tomori-shard-{shard_id}"),
        ("LTM_TRUSTED_PUBLISHERS", " operator , replayer ", "trusted_publishers", "operator,replayer"),
        ("LTM_TRUSTED_PUBLISHERS", "opérateur@ops", "trusted_publishers", "opérateur@ops"),
        ("LTM_TRUSTED_PUBLISHERS", "o" * 255, "trusted_publishers", "o" * 255),
        ("LTM_TRUSTED_PUBLISHERS", "  ", "trusted_publishers", "operator"),
    ],
)
def test_a_valid_identity_setting_is_taken(var: str, raw: str, field: str, value: str) -> None:
    settings = load_settings({var: raw})

    assert getattr(settings, field) == value
    assert (settings.fallbacks, refused_settings(settings)) == ((), {})


def worker_command(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m worker ARGS`` with only ``env`` among the settings' variables (nothing it reaches)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LTM_", "MAX_"))}
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        cwd=REPO,
        env={**clean, "LTM_LOG_FORMAT": "json", **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_worker_run_stops_at_once_on_a_mistyped_shard_identity() -> None:
    """The review's reproduction: `LTM_SHARD_IDENTITY=requried worker run` warned "invalid setting, using the
    default" and ran as `checked`. Now it exits 1 before it connects to anything, naming the variable and the
    values it takes, the way a connection URL that can never work stops it."""
    done = worker_command("run", LTM_SHARD_IDENTITY="requried")

    assert done.returncode == 1, done.stdout + done.stderr
    lines = [
        json.loads(line) for line in done.stdout.splitlines() + done.stderr.splitlines() if line[:1] == "{"
    ]
    [error] = [line for line in lines if line["level"] == "error"]
    assert error["event"] == "cannot start"
    assert error["error"].startswith(
        "LTM_SHARD_IDENTITY='requried' is not one of checked, required, shared; refused: this setting never "
        "falls back to its default ('checked')"
    )
    assert not [line for line in lines if line["event"] == "invalid setting, using the default"]
    assert not [line for line in lines if "waiting" in line["event"] or "unavailable" in line["event"]]


def test_worker_dlq_refuses_a_mistyped_trusted_publishers_list() -> None:
    """`worker dlq` reads the identity settings (a replay under `required`, the letters' senders): it exits 2
    on a refused one, before it connects, like on a connection URL that can never work."""
    done = worker_command("dlq", "list", LTM_TRUSTED_PUBLISHERS="operator,")

    assert done.returncode == 2
    assert done.stderr.startswith("worker dlq: LTM_TRUSTED_PUBLISHERS='operator,' is not RabbitMQ user names")


@pytest.mark.parametrize(
    ("var", "raw", "value", "fell_back"),
    [
        ("LTM_DLQ_RETENTION", "7d", "7d", False),
        ("LTM_DLQ_RETENTION", " 1H30m ", "1h30m", False),
        ("LTM_DLQ_RETENTION", "", "14d", False),
        ("LTM_DLQ_RETENTION", "0", "14d", True),
        ("LTM_DLQ_RETENTION", "14 days", "14d", True),
        ("LTM_DLQ_RETENTION", "3600", "14d", True),
        ("LTM_DLQ_RETENTION_SWEEP", "15m", "15m", False),
        ("LTM_DLQ_RETENTION_SWEEP", "0", "0", False),
        ("LTM_DLQ_RETENTION_SWEEP", "OFF", "0", False),
        ("LTM_DLQ_RETENTION_SWEEP", "hourly", "1h", True),
    ],
)
def test_a_retention_is_a_duration_and_its_sweep_may_be_off(
    var: str, raw: str, value: str, fell_back: bool
) -> None:
    settings = load_settings({var: raw})

    field = "dlq_retention" if var == "LTM_DLQ_RETENTION" else "dlq_retention_sweep"
    assert getattr(settings, field) == value
    assert [fallback[0] for fallback in settings.fallbacks] == ([var] if fell_back else [])


def test_a_retention_reads_as_seconds_and_a_wrong_one_in_code_fails() -> None:
    settings = Settings(dlq_retention="1d12h", dlq_retention_sweep="0")
    assert (settings.dlq_retention_seconds, settings.dlq_retention_sweep_seconds) == (129600, 0)
    assert (Settings().dlq_retention_seconds, Settings().dlq_retention_sweep_seconds) == (1209600, 3600)
    for wrong in ({"dlq_retention": "0"}, {"dlq_retention": "two weeks"}, {"dlq_retention_sweep": "soon"}):
        with pytest.raises(ValidationError):
            Settings.model_validate(wrong)
