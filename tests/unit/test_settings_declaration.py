"""One declaration of the settings: the table of docs/configuration.md, the environment round trip and
the typed model agree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from worker.config import (
    Limits,
    Settings,
    as_env,
    configuration_table,
    declared,
    env_of,
    env_with,
    load_settings,
    overridden_env,
    variable_of,
)

CONFIGURATION = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_configuration_table_is_the_declaration() -> None:
    text = CONFIGURATION.read_text(encoding="utf-8")
    start = text.index("| variable | default | meaning |")
    table = text[start : text.index("\n\n", start)]

    # on a difference: paste what `python -m worker.config` prints
    assert table.splitlines() == configuration_table().splitlines()


def test_every_field_but_the_contract_and_the_record_is_read_from_a_variable() -> None:
    paths = {".".join(s.path) for s in declared()}

    assert set(Settings.model_fields) - {p.split(".")[0] for p in paths} == {
        "topology",
        "fallbacks",
        "notes",
        "from_files",
    }
    assert {p for p in paths if p.startswith("limits.")} == {f"limits.{f}" for f in Limits.model_fields}
    assert len({s.var for s in declared()}) == len(paths)


def test_settings_written_as_variables_read_back_the_same_without_a_fallback() -> None:
    settings = Settings(
        postgres_dsn="postgresql://ltm:s3cret@pg-a,pg-b/bot?sslmode=verify-full",
        rabbitmq_url="amqp://w:p@rmq-1/ltm,amqp://w:p@rmq-2/ltm",
        limits=Limits(max_server_memories=7, notice_preview_limit=9),
        concurrency=3,
        postgres_statement_cache_size=100,
        http_port=9109,
        http_host="0.0.0.0",
        log_format="json",
        log_level="debug",
        tracing="console",
    )
    env = as_env(settings)

    assert set(env) == {s.var for s in declared()}
    assert (env["MAX_SERVER_MEMORIES"], env["LTM_CONCURRENCY"], env["LTM_HTTP_PORT"]) == ("7", "3", "9109")
    assert load_settings(env) == settings
    assert load_settings(as_env(Settings())) == Settings() == load_settings({})


def test_fallbacks_come_in_declaration_order() -> None:
    # "-7," is a value no rule takes: a negative number, no choice, a list of user names with an empty entry
    invalid = {s.var: "-7," for s in declared() if s.env.rule.expected != "a valid value"}
    settings = load_settings(dict(reversed(invalid.items())))

    assert [var for var, _, _ in settings.fallbacks] == list(invalid)
    assert settings.model_dump(exclude={"fallbacks"}) == Settings().model_dump(exclude={"fallbacks"})


@pytest.mark.parametrize("raw", ["²", "1e3", "0x10"])
def test_a_statement_cache_size_that_is_no_decimal_falls_back(raw: str) -> None:
    settings = load_settings({"LTM_POSTGRES_STATEMENT_CACHE_SIZE": raw})

    assert settings.postgres_statement_cache_size == 0
    assert settings.fallbacks == (("LTM_POSTGRES_STATEMENT_CACHE_SIZE", raw, 0),)


@pytest.mark.parametrize(
    "values",
    [
        {"concurrency": 0},
        {"http_port": 70000},
        {"log_level": "verbose"},
        {"postgres_statement_cache_size": -1},
    ],
)
def test_a_value_given_in_code_is_checked_not_fallen_back(values: dict[str, object]) -> None:
    # a fallback is for an operator's text; a wrong value in code is a bug and fails at once
    with pytest.raises(ValidationError):
        Settings.model_validate(values)


def test_a_field_names_its_variable() -> None:
    assert [variable_of(f) for f in ("prefetch", "postgres_pool_size", "max_memory_length")] == [
        "LTM_PREFETCH",
        "LTM_POSTGRES_POOL_SIZE",
        "MAX_MEMORY_LENGTH",
    ]


def test_the_table_is_printed_by_python_m_worker_config() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "worker.config"], capture_output=True, text=True, timeout=60, check=True
    )

    assert done.stdout == configuration_table() + "\n"


def test_env_with_writes_every_setting_with_the_named_ones_changed() -> None:
    settings = Settings(concurrency=3)

    env = env_with(settings, prefetch=8, max_server_memories=5, tracing="console")

    changed = {"LTM_PREFETCH": "8", "MAX_SERVER_MEMORIES": "5", "LTM_TRACING": "console"}
    assert env == as_env(settings) | changed
    assert load_settings(env) == settings.model_copy(
        update={"prefetch": 8, "tracing": "console", "limits": Limits(max_server_memories=5)}
    )


def test_env_of_names_only_the_settings_given_and_refuses_an_unknown_one() -> None:
    assert env_of(postgres_dsn="postgresql://h/db", http_port=0) == {
        "LTM_POSTGRES_DSN": "postgresql://h/db",
        "LTM_HTTP_PORT": "0",
    }
    with pytest.raises(TypeError, match="not a declared setting: prefech"):
        env_of(prefech=8)
    with pytest.raises(TypeError, match="not a declared setting: pool_size"):
        env_with(Settings(), pool_size=8)


def test_an_override_replaces_the_variable_and_its_file_form_and_none_leaves_both() -> None:
    env = {"LTM_REDIS_URL_FILE": "/run/secrets/redis", "LTM_CONCURRENCY": "4"}

    merged = overridden_env(env, redis_url="redis://b/0", prefetch="12abc", concurrency=None)

    assert merged == {
        "LTM_REDIS_URL": "redis://b/0",
        "LTM_PREFETCH": "12abc",
        "LTM_CONCURRENCY": "4",
    }
    assert env["LTM_REDIS_URL_FILE"] == "/run/secrets/redis", "the given mapping is not changed"
    assert load_settings(merged).prefetch == 12, "an override is read by the variable's rule"
