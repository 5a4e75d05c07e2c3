"""``worker migrate``: apply the migrations, each failure one error line that says what to do (a bug is a
traceback)."""

from __future__ import annotations

import asyncio

import structlog

from worker.config import Settings, connection_problems
from worker.observability.logs import log_setting_warnings
from worker.redact import redact_setting


def run_migrate(settings: Settings) -> int:
    """Migrate the database of ``settings``; the exit code (1: refused or failed, said in the log)."""
    log_setting_warnings(settings)  # `worker run` logs them itself, as it starts
    problem = connection_problems(settings, "postgres_dsn").get("postgres_dsn")
    if problem is not None:  # logged, as the rest of migrate's output is
        structlog.get_logger("worker.migrate").error(
            "invalid Postgres connection string", dsn=redact_setting(settings.postgres_dsn), error=problem
        )
        return 1
    return asyncio.run(_migrate(settings.postgres_dsn))


async def _migrate(dsn: str) -> int:
    from worker.store.migrate import MigrationError, apply_migrations
    from worker.store.pool import describe_failure

    log = structlog.get_logger("worker.migrate")
    try:
        applied = await apply_migrations(dsn)
    except MigrationError as exc:
        log.error("migration refused", error=str(exc))
        return 1
    except Exception as exc:
        event = _migrate_failure(exc)
        if event is None:
            raise
        log.error(event, dsn=redact_setting(dsn), error=describe_failure(exc, dsn))
        return 1
    if applied:
        log.info("migrations applied", applied=applied)
    else:
        log.info("schema is up to date")
    return 0


def _migrate_failure(exc: Exception) -> str | None:
    """The event of ``worker migrate``'s one error line for ``exc``, or None for a bug (a traceback)."""
    import ssl

    import asyncpg

    from worker.faults import ClientKeyRefused

    if isinstance(exc, ClientKeyRefused):  # libpq's rule on the key file's mode
        return "Postgres client key refused"
    if isinstance(exc, ssl.SSLCertVerificationError):  # a ValueError too, but the DSN may well be right
        return "cannot reach Postgres"
    if isinstance(exc, ValueError):  # the DSN itself (asyncpg's ClientConfigurationError is a ValueError)
        return "invalid Postgres connection string"
    if isinstance(exc, OSError | TimeoutError | asyncpg.InterfaceError):  # refused, unresolvable, cut
        return "cannot reach Postgres"
    if isinstance(exc, asyncpg.PostgresError):  # the server said no: no such database or role, a privilege
        return "migration failed"
    return None
