"""The ``worker`` console script: ``migrate``, ``run``, ``dlq`` (and the operator commands as they arrive)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Coroutine, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import structlog

from worker.config import LOG_FORMATS, LOG_LEVELS, TRACING_MODES, Settings, load_settings, redact_url
from worker.logs import configure_logging, log_fallbacks

ENVIRONMENT_HELP = """
configuration comes from the environment (see the README for the full table):
  LTM_POSTGRES_DSN   Postgres connection string   (default postgresql://postgres@127.0.0.1:5432/postgres)
  LTM_RABBITMQ_URL   AMQP URL, vhost included      (default amqp://guest:guest@127.0.0.1:5672/)
  LTM_REDIS_URL      Redis URL                     (default redis://127.0.0.1:6379/0)
  MAX_SERVER_MEMORIES, MAX_PERSONAL_MEMORIES, MAX_MEMORY_LENGTH   limits (100, 100, 1000)
  LTM_RETRY_MAX_ATTEMPTS, LTM_RETRY_BASE_DELAY_MS, LTM_RETRY_MAX_DELAY_MS   retries (5, 1000, 60000)
  LTM_PREFETCH, LTM_CONCURRENCY, LTM_POSTGRES_POOL_SIZE, LTM_SHUTDOWN_GRACE_SECONDS (64, 32, 10, 30)
  LTM_LOG_FORMAT, LTM_LOG_LEVEL   logs (auto, info)
  LTM_HTTP_PORT, LTM_HTTP_HOST    the probe endpoint: port (0 = off) and address (127.0.0.1)
  LTM_TRACING        OpenTelemetry spans: off, otlp (OTEL_EXPORTER_OTLP_* variables) or console (off)
command-line options override the environment; a value a setting does not take falls back to its
default with a warning (`worker check` lists them).
"""


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

    migrate = commands.add_parser(
        "migrate",
        help="create or upgrade the database schema (safe to run concurrently and repeatedly)",
        description="Apply the numbered SQL migrations the database has not seen yet. Creates the bot tables "
        "the worker uses when they are missing (never alters an existing one) and the worker's own tables.",
        epilog=ENVIRONMENT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    migrate.add_argument("--postgres-dsn", help="Postgres connection string (env LTM_POSTGRES_DSN)")

    run = commands.add_parser(
        "run",
        help="consume and process tool-call events until SIGTERM/SIGINT",
        description="Consume create_long_term_memory events from the ltm.create_memory queue, save memories, "
        "publish results, notices and cache invalidations. Any number of processes may run at once. "
        "Waits for RabbitMQ, Postgres (migrated) and Redis at start-up. "
        "SIGTERM/SIGINT: stop taking events, finish the "
        "ones in flight within the grace period, exit 0; a second signal exits at once.",
        epilog=ENVIRONMENT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--postgres-dsn", help="Postgres connection string (env LTM_POSTGRES_DSN)")
    run.add_argument("--rabbitmq-url", help="AMQP URL with vhost (env LTM_RABBITMQ_URL)")
    run.add_argument("--redis-url", help="Redis URL (env LTM_REDIS_URL)")
    run.add_argument("--prefetch", type=int, help="deliveries RabbitMQ may push ahead (env LTM_PREFETCH, 64)")
    run.add_argument("--concurrency", type=int, help="events processed at once (env LTM_CONCURRENCY, 32)")
    run.add_argument(
        "--grace-seconds",
        type=int,
        help="how long a stop waits for in-flight events (env LTM_SHUTDOWN_GRACE_SECONDS, 30)",
    )
    run.add_argument("--log-format", choices=LOG_FORMATS, help="env LTM_LOG_FORMAT (auto)")
    run.add_argument("--log-level", choices=LOG_LEVELS, help="env LTM_LOG_LEVEL (info)")
    run.add_argument(
        "--http-port",
        type=int,
        help="serve /healthz, /readyz and /metrics on this port (env LTM_HTTP_PORT; 0 = off, the default)",
    )
    run.add_argument(
        "--http-host",
        help="address the probe endpoint listens on; 0.0.0.0 for every interface "
        "(env LTM_HTTP_HOST; 127.0.0.1)",
    )
    run.add_argument(
        "--tracing",
        choices=TRACING_MODES,
        help="an OpenTelemetry span per event: otlp (configured by OTEL_EXPORTER_OTLP_*) or console "
        "(spans on stdout); needs the tracing extra (env LTM_TRACING; off)",
    )
    check = commands.add_parser(
        "check",
        help="test every connection with the current configuration",
        description="Connect to Postgres (and look for pending migrations), RabbitMQ (and the work queue) "
        "and "
        "Redis with the current configuration; print what works and what does not, and every setting that "
        "fell back to its default (a warning: it does not fail the check). Exit 0 when every dependency "
        "works, 1 otherwise.",
        epilog=ENVIRONMENT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("--postgres-dsn", help="Postgres connection string (env LTM_POSTGRES_DSN)")
    check.add_argument("--rabbitmq-url", help="AMQP URL with vhost (env LTM_RABBITMQ_URL)")
    check.add_argument("--redis-url", help="Redis URL (env LTM_REDIS_URL)")
    check.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: ok (the verdict), dependencies (name: ok, target, detail, problem), "
        "fallbacks (variable, value, default, expected); same exit codes",
    )
    _add_dlq_parser(commands)
    _add_bench_parser(commands)
    return parser


BENCH_MISSING = """\
The load generator ships with the source checkout, not with the worker's wheel or image: from a clone of
the repository, run `python -m bench ...` (or `worker bench ...` with the project installed editable,
`pip install -e '.[bench]'`). Its commands and figures: BENCHMARKS.md.
"""


def _bench_checkout() -> bool:
    """Make the checkout's ``bench`` package importable when this worker runs from a source checkout.

    ``bench`` is not in the wheel (it is a tool, not part of the service), so an editable install does not
    map it: when the ``worker`` package sits in a checkout with ``bench/`` beside it, that checkout's root
    goes on ``sys.path``. False when there is no load generator to run (an installed wheel, the image).
    """
    root = Path(__file__).resolve().parent.parent
    if (root / "bench" / "options.py").is_file() and str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        import bench.options  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "bench":  # the bench is there but broken: say so rather than "not shipped"
            raise
        return False
    return True


def _add_bench_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    if _bench_checkout():
        from bench.options import add_bench_parser

        add_bench_parser(commands)
        return
    stub = commands.add_parser(
        "bench",
        help="the load generator (source checkout only: python -m bench)",
        description=BENCH_MISSING,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # whatever options follow, the answer is where the load generator is, not "unrecognized arguments"
    stub.set_defaults(bench_missing=True)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def _duration(text: str) -> timedelta:
    from worker.dlq import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_dlq_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from worker.dlq import DEFAULT_BATCH, EXIT_CODES_HELP

    epilog = EXIT_CODES_HELP + ENVIRONMENT_HELP
    connection = argparse.ArgumentParser(add_help=False)
    connection.add_argument("--rabbitmq-url", help="AMQP URL with vhost (env LTM_RABBITMQ_URL)")
    connection.add_argument(
        "--batch",
        type=_positive_int,
        default=DEFAULT_BATCH,
        help=f"messages taken from the DLQ per round (default {DEFAULT_BATCH})",
    )
    filters = argparse.ArgumentParser(add_help=False)
    filters.add_argument(
        "--kind",
        action="append",
        metavar="KIND",
        help="only this error kind (malformed, schema, transient_exhausted, internal, or a broker reason "
        "such as delivery_limit); repeat or comma-separate for several",
    )
    filters.add_argument(
        "--event-id", action="append", metavar="ID", help="only this event id; repeat for several"
    )
    filters.add_argument(
        "--older-than",
        type=_duration,
        metavar="DURATION",
        help="only dead letters that failed at least this long ago (30s, 10m, 2h, 1d, 1h30m)",
    )

    dlq = commands.add_parser(
        "dlq",
        help="inspect, replay and purge dead letters (ltm.create_memory.dlq)",
        description="Inspect, replay and purge the dead letters in ltm.create_memory.dlq. Every command "
        "reads the queue in one pass, holding each message unacked until it is settled, so a crash loses "
        "nothing: what was not settled returns to the queue.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list",
        parents=[connection, filters],
        help="one line per dead letter",
        description="One line per dead letter: event id, kind, attempts, failed at, shard, age, error. "
        "A count goes to stderr. The queue is left as it was.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    listing.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per line: event_id, kind, error, attempts, failed_at, shard_id, routing_key",
    )
    show = actions.add_parser(
        "show",
        parents=[connection],
        help="print a dead letter in full",
        description="Print every dead letter with this event id in full: properties, headers, body (as JSON "
        "when it parses). The queue is left as it was.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    show.add_argument("event_id", metavar="EVENT_ID")
    replay = actions.add_parser(
        "replay",
        parents=[connection, filters],
        help="send dead letters back to the work exchange (all by default; no prompt: replay is safe)",
        description="Republish the selected dead letters (all by default) to tomori.tool_calls with their "
        "original routing key, body and properties, without the x-ltm-error/-error-kind/-failed-at/-attempts "
        "and x-death headers, with x-ltm-replayed-at and x-ltm-replay-count added. Each DLQ copy is removed "
        "only after the broker confirmed the republished one, so an interrupted replay loses nothing (at "
        "worst an event is in both queues; the worker's idempotency makes that harmless).",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    replay.add_argument("--limit", type=_positive_int, metavar="N", help="move at most N dead letters")
    replay.add_argument("--dry-run", action="store_true", help="list what would move; move nothing")
    replay.add_argument(
        "--progress", action="store_true", help="print progress to stderr even when it is not a terminal"
    )
    purge = actions.add_parser(
        "purge",
        parents=[connection, filters],
        help="delete dead letters for good (asks first unless --yes)",
        description="Delete the selected dead letters (all by default). Scans the whole queue first, then "
        "asks 'Delete N dead letters? [y/N]'; exactly the N counted are deleted. Without a terminal on "
        "stdin, --yes is required.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    purge.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    purge.add_argument(
        "--progress", action="store_true", help="print progress to stderr even when it is not a terminal"
    )


_OPTION_ENV = {
    "postgres_dsn": "LTM_POSTGRES_DSN",
    "rabbitmq_url": "LTM_RABBITMQ_URL",
    "redis_url": "LTM_REDIS_URL",
    "prefetch": "LTM_PREFETCH",
    "concurrency": "LTM_CONCURRENCY",
    "grace_seconds": "LTM_SHUTDOWN_GRACE_SECONDS",
    "log_format": "LTM_LOG_FORMAT",
    "log_level": "LTM_LOG_LEVEL",
    "http_port": "LTM_HTTP_PORT",
    "http_host": "LTM_HTTP_HOST",
    "tracing": "LTM_TRACING",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``worker`` console script."""
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "bench_missing", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    env = dict(os.environ)
    for option, var in _OPTION_ENV.items():
        value = getattr(args, option, None)
        if value is not None:
            env[var] = str(value)
    settings = load_settings(env)
    configure_logging(settings.log_format, settings.log_level)
    if args.command == "migrate":
        log_fallbacks(settings.fallbacks)  # `worker run` logs them itself, as it starts
        return asyncio.run(_migrate(settings.postgres_dsn))
    if args.command == "run":
        from worker.http import ListenError
        from worker.runner import Worker

        try:
            return _run_fast(Worker(settings).run())
        except ListenError as exc:
            structlog.get_logger("worker").error("probe endpoint cannot start", error=str(exc))
            return 1
    if args.command == "check":
        from worker.check import as_json, render, run_checks

        results = asyncio.run(run_checks(settings))
        if args.json:
            print(json.dumps(as_json(results, settings.fallbacks)))
        else:
            print(render(results, settings.fallbacks))
        return 0 if all(r.ok for r in results) else 1
    if args.command == "dlq":
        from worker.dlq import EXIT_INTERRUPTED

        try:
            code = asyncio.run(_dlq(args, settings))
        except KeyboardInterrupt:  # the sweep's cleanup already requeued what it held
            print("interrupted; dead letters not yet settled stay in the DLQ", file=sys.stderr)
            return EXIT_INTERRUPTED
        try:
            sys.stdout.flush()
        except BrokenPipeError:  # the reader of a pipe left early: nothing more to say, and no traceback
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return code
    if args.command == "bench":
        if getattr(args, "bench_missing", False):
            print(f"worker bench: {BENCH_MISSING}", end="", file=sys.stderr)
            return 2
        from bench.run import main as bench

        return bench(args)
    return 2


def _version() -> str:
    """The installed distribution's version (pyproject.toml), or ``unknown`` when run from a bare tree."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tomoribot-ltm-worker")
    except PackageNotFoundError:
        return "unknown"


async def _dlq(args: argparse.Namespace, settings: Settings) -> int:
    from worker import dlq

    # the commands report connection failures themselves, in one line; the client libraries' own error
    # logs (aiormq logs every failed connect) would only repeat them as noise
    for name in ("aiormq", "aio_pika"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    url, topology = settings.rabbitmq_url, settings.topology
    if args.dlq_command == "show":
        return await dlq.show_command(url, topology, args.event_id, batch=args.batch)
    kinds = {kind.strip() for value in args.kind or () for kind in value.split(",") if kind.strip()}
    selection = dlq.Selection(
        kinds=frozenset(kinds), event_ids=frozenset(args.event_id or ()), older_than=args.older_than
    )
    if args.dlq_command == "list":
        return await dlq.list_command(url, topology, selection, batch=args.batch, as_json=args.json)
    if args.dlq_command == "replay":
        return await dlq.replay_command(
            url,
            topology,
            selection,
            batch=args.batch,
            limit=args.limit,
            dry_run=args.dry_run,
            progress=args.progress,
        )
    return await dlq.purge_command(
        url, topology, selection, yes=args.yes, batch=args.batch, progress=args.progress
    )


def _run_fast(main: Coroutine[Any, Any, int]) -> int:
    """Run ``main`` on uvloop where it is installed (fewer cycles per socket operation), else asyncio."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on the platforms it supports
        return asyncio.run(main)
    return uvloop.run(main)


async def _migrate(dsn: str) -> int:
    import asyncpg

    from worker.store.migrate import MigrationError, apply_migrations
    from worker.store.pool import describe_failure

    log = structlog.get_logger("worker.migrate")
    try:
        applied = await apply_migrations(dsn)
    except MigrationError as exc:
        log.error("migration refused", error=str(exc))
        return 1
    except ValueError as exc:  # the DSN itself (asyncpg's ClientConfigurationError is a ValueError)
        log.error("invalid Postgres connection string", dsn=redact_url(dsn), error=describe_failure(exc))
        return 1
    except (OSError, TimeoutError, asyncpg.InterfaceError) as exc:  # refused, unresolvable, cut mid-way
        log.error("cannot reach Postgres", dsn=redact_url(dsn), error=describe_failure(exc))
        return 1
    except asyncpg.PostgresError as exc:  # the server said no: no such database or role, a privilege
        log.error("migration failed", dsn=redact_url(dsn), error=describe_failure(exc))
        return 1
    if applied:
        log.info("migrations applied", applied=applied)
    else:
        log.info("schema is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
