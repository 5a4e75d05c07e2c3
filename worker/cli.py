"""The ``worker`` console script: ``migrate``, ``run``, ``dlq`` (and the operator commands as they arrive)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from worker.broker import content_header
from worker.config import (
    Settings,
    SettingsError,
    connection_problems,
    declared,
    environment_help,
    load_settings,
    overridden_env,
    refused_settings,
)
from worker.config.rules import Choice, NonNegativeInt, Port, PositiveInt
from worker.observability.logs import configure_logging, guard_std_streams
from worker.ops.subcommands import Action, AllSettings, Setting, add_action, option

ENVIRONMENT_HELP = environment_help()
#: what the commands that read a few settings list (the log settings: every command logs)
_LOGS = ("log_format", "log_level")
MIGRATE_HELP = environment_help("postgres_dsn", *_LOGS)
_EPILOGS = {"migrate": MIGRATE_HELP}
DEMO_HELP = environment_help(
    "postgres_dsn", "rabbitmq_url", "retry_max_attempts", "retry_base_delay_ms", "retry_max_delay_ms"
)


def add_setting_options(parser: argparse.ArgumentParser, *fields: str) -> None:
    """Add to ``parser`` the options of the settings named ``fields`` (all that have one when none are named).

    Help, type and choices come from the declaration. The CLI puts an option's value in the environment
    (worker/cli.py ``settings_for``), so it goes through the variable's rule and falls back like it.
    """
    for setting in declared():
        option = setting.env.option
        if option is None or (fields and setting.path[-1] not in fields):
            continue
        rule = setting.env.rule
        help_text = (
            f"{setting.description.replace('`', '')} (env {setting.var}; default {setting.shown_default})"
        )
        if setting.env.file:
            help_text += (
                f"; overrides {setting.env.file_var} too, but shows in the process list: prefer that file"
            )
        kwargs: dict[str, Any] = {"help": help_text.replace("%", "%%")}
        if isinstance(rule, Choice):
            kwargs["choices"] = rule.choices
        elif isinstance(rule, (PositiveInt, NonNegativeInt, Port)):
            # read as text, by the variable's rule: `--concurrency abc` falls back like LTM_CONCURRENCY=abc
            kwargs["metavar"] = "N"
        parser.add_argument(option, **kwargs)


#: ``worker``'s own commands, declared as data; ``worker dlq`` and ``worker demo`` are declared beside their
#: steps (worker/ops/dlq/cli.py, worker/ops/demo/cli.py)
COMMANDS: tuple[Action, ...] = (
    Action(
        "migrate",
        help="create or upgrade the database schema (safe to run concurrently and repeatedly)",
        description="Apply the numbered SQL migrations the database has not seen yet. Creates the bot tables "
        "the worker uses when they are missing (never alters an existing one) and the worker's own tables.",
        options=(Setting("postgres_dsn"),),
    ),
    Action(
        "run",
        help="consume and process tool-call events until SIGTERM/SIGINT",
        description="Consume create_long_term_memory events from the ltm.create_memory queue, save memories, "
        "publish results, notices and cache invalidations. Any number of processes may run at once. "
        "Waits for RabbitMQ, Postgres (migrated) and Redis at start-up. "
        "SIGTERM/SIGINT: stop taking events, finish the "
        "ones in flight within the grace period, exit 0; a second signal exits at once. Beside it, every "
        "LTM_DLQ_RETENTION_SWEEP, one worker of the fleet runs `worker dlq expire` "
        '(docs/dead-letters.md "Retention").',
        options=(AllSettings(),),
    ),
    Action(
        "check",
        help="test every connection with the current configuration",
        description="Connect to Postgres (and look for pending migrations), RabbitMQ (and the work queue) "
        "and "
        "Redis with the current configuration; print what works and what does not, and every setting that "
        "fell back to its default (a warning: it does not fail the check); an identity setting "
        "(LTM_SHARD_IDENTITY, LTM_SHARD_USER, LTM_TRUSTED_PUBLISHERS) given a value it does not take fails "
        "it, as the worker would not start. With --management-url, also the shards' own queues: one that "
        "carries a dead-letter argument fails the check (CONTRACT.md section 2). Exit 0 when the worker can "
        "run "
        "(Postgres and Redis work, one listed RabbitMQ node answers; a node that does not is a warning), "
        "1 otherwise.",
        options=(
            Setting("postgres_dsn"),
            Setting("rabbitmq_url"),
            Setting("redis_url"),
            option(
                "--json",
                action="store_true",
                help="print one JSON object: ok (the verdict), dependencies (name: ok, target, detail, "
                "problem; several RabbitMQ nodes: nodes, the same per node), warnings (dependency, target, "
                "problem: the nodes that did not answer), fallbacks (variable, value, default, expected), "
                "notes (variable, note: a value read other than as written, a DSN without sslmode, an "
                "unknown LTM_ variable); same exit codes",
            ),
            option(
                "--all-nodes",
                action="store_true",
                help="fail unless every RabbitMQ node listed in LTM_RABBITMQ_URL answers (by default one "
                "answering node is enough, as it is for the worker; the others are warnings)",
            ),
            option(
                "--management-url",
                metavar="URL",
                help="RabbitMQ's management API (http://rabbitmq:15672): also read the shards' own queues "
                "(tomori.shard.<n>.results, .notifications) and fail on any that carries an x-dead-letter-* "
                "argument, which would hand its messages on to another shard's queue. The user and password "
                "are the URL's, else LTM_RABBITMQ_URL's (that user needs the management or monitoring tag). "
                "Without it that check is skipped, said on a skip line: AMQP cannot read a queue's arguments",
            ),
        ),
    ),
    Action(
        "shards",
        help="who is loud: each shard's events in, answered, waiting and wait, and its share of the backlog",
        description="Add up what every worker recorded of every shard over the last minutes (Postgres: "
        "ltm_shard_activity, written every LTM_METRICS_INTERVAL_SECONDS: the header says how old) and how "
        "many events wait in each shard's own queue and in the common one (RabbitMQ, now). Loudest first, "
        "the quiet shards folded into one line; under a loud shard, where its backlog is and what to do "
        "(docs/operating.md). Exit 0, or 1 when neither Postgres nor RabbitMQ answered.",
        options=(
            Setting("postgres_dsn"),
            Setting("rabbitmq_url"),
            option("--minutes", type=float, default=15.0, help="how far back to add up (15)"),
            option(
                "--json",
                action="store_true",
                help="one JSON object instead of the table; the waits as their buckets' upper bounds "
                "(wait_p50_le_s, wait_p99_le_s: docs/operating.md)",
            ),
            option("--all", action="store_true", help="also list the quiet shards (nothing in the window)"),
            option(
                "--forget",
                type=int,
                nargs="+",
                metavar="SHARD",
                help="instead of the report: remove the own queues of these shards, gone after resharding; "
                "each shard's row of ltm_shard_queues first (or the workers declare the queue again), then "
                "its queue if it is empty; a shard heard from within --quiet-minutes, or whose queue holds "
                "events, is left, row and all. Exit 1 when any was left",
            ),
            option(
                "--declare",
                type=int,
                nargs="+",
                metavar="SHARD",
                help="instead of the report: give these shards their own queue ahead of their first event (a "
                "row of ltm_shard_queues under LTM_SHARD_QUEUES_MAX, then the queue and its bindings), so "
                "shards on the kit publish with their own routing key from the start instead of through the "
                "common queue. Exit 1 when any was left without",
            ),
            option(
                "--quiet-minutes",
                type=float,
                default=10.0,
                help="with --forget: a shard any worker saw an event of this recently is not gone (10)",
            ),
        ),
    ),
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="worker",
        description="TomoriBot long-term memory worker: saves create_long_term_memory tool calls from "
        "RabbitMQ into Postgres and answers the bot shards.",
        epilog=ENVIRONMENT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for action in COMMANDS:
        add_action(commands, action, add_setting_options, _EPILOGS.get(action.name, ENVIRONMENT_HELP))
    from worker.ops.dlq.cli import add_dlq_parser

    add_dlq_parser(commands, add_setting_options)
    from worker.ops.demo.cli import add_demo_parser

    add_demo_parser(commands, DEMO_HELP, add_setting_options)
    return parser


#: option dest -> the field of the setting it overrides, for every setting with a `worker run` option
_OPTION_FIELD = {
    s.env.option.lstrip("-").replace("-", "_"): s.path[-1] for s in declared() if s.env.option is not None
}


def settings_for(args: argparse.Namespace, env: Mapping[str, str]) -> Settings:
    """The settings of a command: ``env`` with the command's options on top, read by the same rules (an
    option overrides the setting's ``_FILE`` variable too). Raises :class:`SettingsError`."""
    options = {field: getattr(args, option, None) for option, field in _OPTION_FIELD.items()}
    return load_settings(overridden_env(env, **options))


#: the exit code of a command whose settings cannot be read or whose connection URL can never work: `dlq`'s
#: "bad options", the others' "failed"
_SETTINGS_EXIT = {"dlq": 2, "demo": 2}


def _settings_refused(command: str, problem: str, *, as_json: bool = False) -> int:
    """One line on stderr (``check --json``: the report object on stdout) and the command's exit code."""
    if as_json:
        report = {
            "ok": False,
            "error": problem,
            "dependencies": {},
            "warnings": [],
            "fallbacks": [],
            "notes": [],
        }
        print(json.dumps(report))
    else:
        print(f"worker {command}: {problem}", file=sys.stderr)
    return _SETTINGS_EXIT.get(command, 1)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``worker`` console script."""
    guard_std_streams()  # a reader that went away (`worker run | head`) must not break a command mid-way
    # process-wide: every connection this process opens (the worker's, `worker dlq`'s) decodes any content
    # header, so one malformed property never costs a connection (worker/broker/content_header.py)
    content_header.install()
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        settings = settings_for(args, os.environ)
    except SettingsError as exc:  # before logging is set up: its format is a setting too
        return _settings_refused(args.command, str(exc), as_json=getattr(args, "json", False))
    configure_logging(settings.log_format, settings.log_level)
    runner = RUNNERS.get(args.command)
    if runner is None:
        return 2
    refusals = [*connection_problems(settings, *runner.needs).values()] if runner.needs else []
    if runner.identity:
        refusals += refused_settings(settings).values()
    if refusals:
        return _settings_refused(args.command, "; ".join(refusals))
    return runner.run(args, settings)


@dataclass(frozen=True)
class Runner:
    """What a command needs of its settings before it starts, and what runs it."""

    run: Callable[[argparse.Namespace, Settings], int]
    #: the connection settings a command cannot start without: one that can never work (a malformed URL)
    #: refuses it in one line, with its exit code (``_SETTINGS_EXIT``)
    needs: tuple[str, ...] = ()
    #: the identity settings (LTM_SHARD_IDENTITY, LTM_TRUSTED_PUBLISHERS) refuse it too when misspelled
    identity: bool = False


def _run_migrate(args: argparse.Namespace, settings: Settings) -> int:
    from worker.ops.migrate import run_migrate

    return run_migrate(settings)


def _run_worker(args: argparse.Namespace, settings: Settings) -> int:
    from worker.observability.http_server import ListenError

    try:
        return _run_fast(_serve(settings))
    except ListenError as exc:
        structlog.get_logger("worker").error("probe endpoint cannot start", error=str(exc))
        return 1


async def _serve(settings: Settings) -> int:
    """The worker, and beside it the retention sweep of the dead letters (LTM_DLQ_RETENTION_SWEEP; an
    operator's tool, which the composition root may not import, so it starts here)."""
    from worker.ops.dlq.retention import RetentionSweeps
    from worker.runner import Worker

    sweeps = RetentionSweeps(settings)
    sweeps.start()
    try:
        return await Worker(settings).run()
    finally:
        await sweeps.stop()


def _run_check(args: argparse.Namespace, settings: Settings) -> int:
    from worker.ops.check import SHARD_QUEUES_SKIPPED, as_json, judge, render, run_checks

    results = asyncio.run(run_checks(settings, management_url=args.management_url))
    refused = refused_settings(settings)  # listed as failures by run_checks, not as fallbacks
    fallbacks = tuple(fallback for fallback in settings.fallbacks if fallback[0] not in refused)
    skipped = () if args.management_url else (("shard queues", SHARD_QUEUES_SKIPPED),)
    report = (results, fallbacks, settings.notes)
    if args.json:
        print(json.dumps(as_json(*report, all_nodes=args.all_nodes, skipped=skipped)))
    else:
        print(render(*report, all_nodes=args.all_nodes, skipped=skipped))
    return 0 if judge(results, all_nodes=args.all_nodes).ok else 1


def _run_shards(args: argparse.Namespace, settings: Settings) -> int:
    if args.declare:
        from worker.ops.shard_queues import run_declare

        return run_declare(settings, args.declare)
    if args.forget:
        from worker.ops.shard_queues import run_forget

        return run_forget(settings, args.forget, quiet_minutes=args.quiet_minutes)
    from worker.ops.shards_report import run_shards

    return run_shards(settings, minutes=args.minutes, json_output=args.json, show_quiet=args.all)


def _run_dlq(args: argparse.Namespace, settings: Settings) -> int:
    from worker.ops.dlq.cli import run_dlq

    return run_dlq(args, settings)


def _run_demo(args: argparse.Namespace, settings: Settings) -> int:
    from worker.ops.demo.command import run_demo

    return run_demo(args, settings)


#: every command -> what it needs of its settings and what runs it, as :data:`COMMANDS` declares their
#: options. `migrate` checks its DSN itself (its refusal is a log line) and `run` at start-up (the worker
#: logs it); `dlq` is also refused by an identity setting: a replay is checked by them
#: (LTM_SHARD_IDENTITY=required refuses what has no known sender), and the letters' senders are read by
#: LTM_TRUSTED_PUBLISHERS
RUNNERS: Mapping[str, Runner] = {
    "migrate": Runner(_run_migrate),
    "run": Runner(_run_worker),
    "check": Runner(_run_check),
    "shards": Runner(_run_shards, needs=("postgres_dsn", "rabbitmq_url")),
    "dlq": Runner(_run_dlq, needs=("rabbitmq_url",), identity=True),
    "demo": Runner(_run_demo, needs=("postgres_dsn", "rabbitmq_url")),
}


def _version() -> str:
    """The installed distribution's version (pyproject.toml), or ``unknown`` when run from a bare tree."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tomoribot-ltm-worker")
    except PackageNotFoundError:
        return "unknown"


def _run_fast(main: Coroutine[Any, Any, int]) -> int:
    """Run ``main`` on uvloop where it is installed (fewer cycles per socket operation), else asyncio."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on the platforms it supports
        return asyncio.run(main)
    return uvloop.run(main)


if __name__ == "__main__":
    sys.exit(main())
