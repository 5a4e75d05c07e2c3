"""The ``worker`` console script: ``migrate``, ``run`` (and the operator commands as they arrive)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

import structlog

from worker.config import load_settings
from worker.logs import configure_logging

ENVIRONMENT_HELP = """
configuration comes from the environment (see the README for the full table):
  LTM_POSTGRES_DSN   Postgres connection string   (default postgresql://postgres@127.0.0.1:5432/postgres)
  LTM_RABBITMQ_URL   AMQP URL, vhost included      (default amqp://guest:guest@127.0.0.1:5672/)
  LTM_REDIS_URL      Redis URL                     (default redis://127.0.0.1:6379/0)
  MAX_SERVER_MEMORIES, MAX_PERSONAL_MEMORIES, MAX_MEMORY_LENGTH   limits (100, 100, 1000)
  LTM_RETRY_MAX_ATTEMPTS, LTM_RETRY_BASE_DELAY_MS, LTM_RETRY_MAX_DELAY_MS   retries (5, 1000, 60000)
  LTM_PREFETCH, LTM_CONCURRENCY, LTM_SHUTDOWN_GRACE_SECONDS, LTM_LOG_FORMAT, LTM_LOG_LEVEL
command-line options override the environment.
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="worker",
        description="TomoriBot long-term memory worker: saves create_long_term_memory tool calls from "
        "RabbitMQ into Postgres and answers the bot shards.",
        epilog=ENVIRONMENT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
        "Waits for "
        "RabbitMQ, Postgres (migrated) and Redis at start-up. SIGTERM/SIGINT: stop taking events, finish the "
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
    run.add_argument("--log-format", choices=("auto", "json", "console"), help="env LTM_LOG_FORMAT (auto)")
    run.add_argument(
        "--log-level", choices=("debug", "info", "warning", "error"), help="env LTM_LOG_LEVEL (info)"
    )
    return parser


_OPTION_ENV = {
    "postgres_dsn": "LTM_POSTGRES_DSN",
    "rabbitmq_url": "LTM_RABBITMQ_URL",
    "redis_url": "LTM_REDIS_URL",
    "prefetch": "LTM_PREFETCH",
    "concurrency": "LTM_CONCURRENCY",
    "grace_seconds": "LTM_SHUTDOWN_GRACE_SECONDS",
    "log_format": "LTM_LOG_FORMAT",
    "log_level": "LTM_LOG_LEVEL",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``worker`` console script."""
    args = _parser().parse_args(argv)
    env = dict(os.environ)
    for option, var in _OPTION_ENV.items():
        value = getattr(args, option, None)
        if value is not None:
            env[var] = str(value)
    settings = load_settings(env)
    configure_logging(settings.log_format, settings.log_level)
    if args.command == "migrate":
        return asyncio.run(_migrate(settings.postgres_dsn))
    if args.command == "run":
        from worker.runner import Worker

        return asyncio.run(Worker(settings).run())
    return 2


async def _migrate(dsn: str) -> int:
    from worker.store.migrate import MigrationError, apply_migrations

    log = structlog.get_logger("worker.migrate")
    try:
        applied = await apply_migrations(dsn)
    except MigrationError as exc:
        log.error("migration refused", error=str(exc))
        return 1
    except (OSError, ConnectionError) as exc:
        log.error("cannot reach Postgres", dsn=_redact(dsn), error=str(exc))
        return 1
    if applied:
        log.info("migrations applied", applied=applied)
    else:
        log.info("schema is up to date")
    return 0


def _redact(dsn: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(dsn)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return dsn


if __name__ == "__main__":
    sys.exit(main())
