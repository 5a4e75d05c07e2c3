"""The command line's overrides and help come from the settings' declaration."""

from __future__ import annotations

import argparse
from pathlib import Path

from worker.cli import ENVIRONMENT_HELP, _parser, settings_for
from worker.config import Settings, declared


def subcommand(name: str) -> argparse.ArgumentParser:
    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = commands.choices[name]
    return parser


def test_run_has_an_option_for_every_setting_that_declares_one_with_its_variable_and_default() -> None:
    helps = {option: action.help for action in subcommand("run")._actions for option in action.option_strings}

    with_option = [s for s in declared() if s.env.option is not None]
    assert {"--prefetch", "--concurrency", "--grace-seconds", "--http-port", "--tracing"} <= {
        s.env.option for s in with_option
    }
    for setting in with_option:
        assert f"(env {setting.var}; default {setting.shown_default})" in str(helps[setting.env.option])


def test_the_environment_help_lists_every_variable_with_its_default() -> None:
    for setting in declared():
        assert any(
            line.split() == [setting.var, "default", *setting.shown_default.split()]
            for line in ENVIRONMENT_HELP.splitlines()
        ), setting.var


def test_an_option_overrides_the_variable_and_falls_back_like_it() -> None:
    args = _parser().parse_args(["run", "--prefetch", "0", "--concurrency", "3", "--http-port", "70000"])
    settings = settings_for(args, {"LTM_PREFETCH": "7", "LTM_CONCURRENCY": "9", "LTM_LOG_LEVEL": "debug"})

    default = Settings().prefetch
    assert (settings.prefetch, settings.concurrency, settings.http_port, settings.log_level) == (
        default,
        3,
        0,
        "debug",
    )
    assert settings.fallbacks == (("LTM_PREFETCH", "0", default), ("LTM_HTTP_PORT", "70000", 0))


def test_check_and_migrate_take_only_their_connection_options() -> None:
    def options(name: str) -> set[str]:
        return {
            o for a in subcommand(name)._actions for o in a.option_strings if o.endswith(("-dsn", "-url"))
        }

    # and --management-url, which is no setting: the management API that the shard-queue check reads
    assert options("check") == {"--postgres-dsn", "--rabbitmq-url", "--redis-url", "--management-url"}
    assert options("migrate") == {"--postgres-dsn"}
    args = _parser().parse_args(["check", "--redis-url", "redis://cache:6379/1"])
    assert settings_for(args, {"LTM_REDIS_URL": "redis://other/0"}).redis_url == "redis://cache:6379/1"


def test_an_option_overrides_the_file_variable_too(tmp_path: Path) -> None:
    path = tmp_path / "url"
    path.write_text("redis://:from-file@cache:6379/0\n")
    env = {"LTM_REDIS_URL_FILE": str(path)}

    from_file = settings_for(_parser().parse_args(["check"]), env)
    overridden = settings_for(_parser().parse_args(["check", "--redis-url", "redis://other:6379/1"]), env)

    assert (from_file.redis_url, from_file.from_files) == (
        "redis://:from-file@cache:6379/0",
        ("LTM_REDIS_URL",),
    )
    assert (overridden.redis_url, overridden.from_files) == ("redis://other:6379/1", ())
    assert "LTM_REDIS_URL may be given as <VARIABLE>_FILE instead" in ENVIRONMENT_HELP


def test_an_integer_option_that_is_no_integer_falls_back_like_its_variable() -> None:
    by_option = settings_for(_parser().parse_args(["run", "--concurrency", "abc"]), {})
    by_variable = settings_for(_parser().parse_args(["run"]), {"LTM_CONCURRENCY": "abc"})

    assert by_option.concurrency == by_variable.concurrency == 32
    assert by_option.fallbacks == by_variable.fallbacks == (("LTM_CONCURRENCY", "abc", 32),)


def test_migrate_and_dlq_help_list_only_the_settings_they_read() -> None:
    def listed(name: str) -> set[str]:
        epilog = subcommand(name).epilog or ""
        return {line.split()[0] for line in epilog.splitlines() if line.startswith(("  LTM_", "  MAX_"))}

    assert listed("migrate") == {"LTM_POSTGRES_DSN", "LTM_LOG_FORMAT", "LTM_LOG_LEVEL"}
    # `worker dlq` reads the broker, Postgres for the audit record of a replay or purge, and the identity
    # settings: who vouches for a letter's sender, and whether a replay of one with none known is refused
    assert listed("dlq") == {
        "LTM_RABBITMQ_URL",
        "LTM_POSTGRES_DSN",
        "LTM_SHARD_IDENTITY",
        "LTM_TRUSTED_PUBLISHERS",
        "LTM_LOG_FORMAT",
        "LTM_LOG_LEVEL",
    }
    assert "MAX_SERVER_MEMORIES" in (subcommand("run").epilog or "")
