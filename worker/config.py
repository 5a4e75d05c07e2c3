"""Settings from the environment, read once at start-up into one typed object.

Every variable is listed in the README. Integer settings follow the original bot's parse
(``Number.parseInt``: leading digits count, so ``"12abc"`` is 12); a value that is not an integer > 0
falls back to the default. So does every other setting given a value it does not take (a port that is no
port, an unknown log format, level or tracing mode): each fallback is recorded in ``Settings.fallbacks``,
which ``worker run`` and ``worker migrate`` log as warnings and ``worker check`` lists.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

DEFAULT_POSTGRES_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

#: LTM_TRACING values (worker/tracing.py)
TRACING_MODES = ("off", "otlp", "console")
#: LTM_LOG_FORMAT and LTM_LOG_LEVEL values (worker/logs.py)
LOG_FORMATS = ("auto", "json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error")
#: where the probe and metrics endpoint listens unless LTM_HTTP_HOST says otherwise: this host only
DEFAULT_HTTP_HOST = "127.0.0.1"


_KEYWORD_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` with every password replaced by ``***``, for logs and messages.

    Also for a comma-separated list of URLs (several RabbitMQ nodes, worker/broker/urls.py), a libpq
    multi-host URI (``postgresql://u:p@a,b/db``) and a libpq keyword DSN (``host=a,b password=...``).
    """
    if "://" not in url:
        return _KEYWORD_PASSWORD.sub(r"\1***", url)
    return ",".join(_redact_one(part) for part in url.split(","))


def _redact_one(url: str) -> str:
    # a piece of a list or of a multi-host URI without a scheme ("b:5432/db") has no password to hide
    parts = urlsplit(url) if "://" in url else None
    if parts is None or parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


_LEADING_INT = re.compile(r"^\s*([+-]?\d+)")


def parse_positive_int(raw: str | None, default: int) -> tuple[int, bool]:
    """Parse like JS ``parseInt(raw, 10)``; return ``(value, fell_back)``.

    ``fell_back`` is true when ``raw`` was given but is not an integer > 0 (the default is used).
    """
    if raw is None or raw == "":
        return default, False
    match = _LEADING_INT.match(raw)
    if match is None:
        return default, True
    value = int(match.group(1))
    if value <= 0:
        return default, True
    return value, False


def parse_port(raw: str) -> int | None:
    """A TCP port 0..65535 (empty is 0: off), or None when ``raw`` is not one."""
    text = raw.strip()
    if not text:
        return 0
    if not (text.isascii() and text.isdigit()) or int(text) > 65535:
        return None
    return int(text)


@dataclass(frozen=True, slots=True)
class Limits:
    """Memory limits of SPEC.md (defaults of the current bot)."""

    max_server_memories: int = 100
    max_personal_memories: int = 100
    max_memory_length: int = 1000
    notice_preview_limit: int = 600


@dataclass(frozen=True, slots=True)
class Topology:
    """Exchange, queue and channel names of CONTRACT.md. The defaults are the contract."""

    tool_calls_exchange: str = "tomori.tool_calls"
    work_queue: str = "ltm.create_memory"
    routing_keys: tuple[str, ...] = ("tool.create_long_term_memory", "tool.remember_this_fact")
    results_exchange: str = "tomori.tool_results"
    notifications_exchange: str = "tomori.notifications"
    dead_letter_exchange: str = "tomori.dead_letter"
    dead_letter_queue: str = "ltm.create_memory.dlq"
    retry_queue_prefix: str = "ltm.create_memory.retry"
    invalidation_channel: str = "tomori:cache-invalidation"


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the worker is configured with."""

    postgres_dsn: str = DEFAULT_POSTGRES_DSN
    rabbitmq_url: str = DEFAULT_RABBITMQ_URL
    redis_url: str = DEFAULT_REDIS_URL
    limits: Limits = field(default_factory=Limits)
    topology: Topology = field(default_factory=Topology)
    retry_max_attempts: int = 5
    retry_base_delay_ms: int = 1000
    retry_max_delay_ms: int = 60000
    prefetch: int = 64
    concurrency: int = 32
    postgres_pool_size: int = 10
    #: asyncpg's prepared-statement cache per connection; 0 (off) also works through a transaction-pooling
    #: PgBouncer, which a cache breaks (worker/store/pool.py)
    postgres_statement_cache_size: int = 0
    shutdown_grace_seconds: int = 30
    log_format: str = "auto"
    log_level: str = "info"
    http_port: int = 0
    #: address the probe endpoint binds (``0.0.0.0`` for every interface, as in a container)
    http_host: str = DEFAULT_HTTP_HOST
    #: how often queue depths and dependency state are sampled for /metrics (worker/sampler.py)
    metrics_interval_seconds: int = 15
    #: OpenTelemetry spans: ``off``, ``otlp`` or ``console`` (worker/tracing.py)
    tracing: str = "off"
    #: settings that were given but invalid, as (variable, raw value, default used)
    fallbacks: tuple[tuple[str, str, int | str], ...] = ()


#: integer settings: environment variable -> (Settings or Limits field, default)
_LIMIT_VARS = {
    "MAX_SERVER_MEMORIES": ("max_server_memories", 100),
    "MAX_PERSONAL_MEMORIES": ("max_personal_memories", 100),
    "MAX_MEMORY_LENGTH": ("max_memory_length", 1000),
    "MEMORY_NOTICE_PREVIEW_LIMIT": ("notice_preview_limit", 600),
}
_INT_VARS = {
    "LTM_RETRY_MAX_ATTEMPTS": ("retry_max_attempts", 5),
    "LTM_RETRY_BASE_DELAY_MS": ("retry_base_delay_ms", 1000),
    "LTM_RETRY_MAX_DELAY_MS": ("retry_max_delay_ms", 60000),
    "LTM_PREFETCH": ("prefetch", 64),
    "LTM_CONCURRENCY": ("concurrency", 32),
    "LTM_POSTGRES_POOL_SIZE": ("postgres_pool_size", 10),
    "LTM_SHUTDOWN_GRACE_SECONDS": ("shutdown_grace_seconds", 30),
    "LTM_METRICS_INTERVAL_SECONDS": ("metrics_interval_seconds", 15),
}
#: what each setting that can fall back takes, for the warning and `worker check`
_EXPECTED = {
    **{var: "an integer > 0" for var in (*_LIMIT_VARS, *_INT_VARS)},
    "LTM_HTTP_PORT": "a port number 0..65535 (0 or empty: off)",
    "LTM_POSTGRES_STATEMENT_CACHE_SIZE": "an integer >= 0 (0: off)",
    "LTM_LOG_FORMAT": "one of " + ", ".join(LOG_FORMATS),
    "LTM_LOG_LEVEL": "one of " + ", ".join(LOG_LEVELS),
    "LTM_TRACING": "one of " + ", ".join(TRACING_MODES),
}


def expected_value(var: str) -> str:
    """What the setting ``var`` takes, in words (for the message about a value that fell back)."""
    return _EXPECTED.get(var, "a valid value")


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Build the settings from ``env`` (default: ``os.environ``)."""
    env = os.environ if env is None else env
    fallbacks: list[tuple[str, str, int | str]] = []

    def integer(var: str, default: int) -> int:
        raw = env.get(var)
        value, fell_back = parse_positive_int(raw, default)
        if fell_back and raw is not None:
            fallbacks.append((var, raw, default))
        return value

    def choice(var: str, choices: tuple[str, ...], default: str) -> str:
        raw = env.get(var) or ""
        value = raw.strip().lower() or default
        if value not in choices:
            fallbacks.append((var, raw, default))
            return default
        return value

    limits = Limits(**{name: integer(var, default) for var, (name, default) in _LIMIT_VARS.items()})
    ints = {name: integer(var, default) for var, (name, default) in _INT_VARS.items()}
    http_raw = env.get("LTM_HTTP_PORT") or ""
    http_port = parse_port(http_raw)
    if http_port is None:
        fallbacks.append(("LTM_HTTP_PORT", http_raw, 0))
        http_port = 0
    cache_raw = env.get("LTM_POSTGRES_STATEMENT_CACHE_SIZE", "").strip()
    statement_cache_size = 0
    if cache_raw:
        # 0 is the useful value here, so not parse_positive_int: a non-negative integer or the default
        if cache_raw.isdigit():
            statement_cache_size = int(cache_raw)
        else:
            fallbacks.append(("LTM_POSTGRES_STATEMENT_CACHE_SIZE", cache_raw, 0))
    return Settings(
        postgres_dsn=env.get("LTM_POSTGRES_DSN") or DEFAULT_POSTGRES_DSN,
        rabbitmq_url=env.get("LTM_RABBITMQ_URL") or DEFAULT_RABBITMQ_URL,
        redis_url=env.get("LTM_REDIS_URL") or DEFAULT_REDIS_URL,
        limits=limits,
        log_format=choice("LTM_LOG_FORMAT", LOG_FORMATS, "auto"),
        log_level=choice("LTM_LOG_LEVEL", LOG_LEVELS, "info"),
        http_port=http_port,
        http_host=(env.get("LTM_HTTP_HOST") or "").strip() or DEFAULT_HTTP_HOST,
        tracing=choice("LTM_TRACING", TRACING_MODES, "off"),
        retry_max_attempts=ints["retry_max_attempts"],
        retry_base_delay_ms=ints["retry_base_delay_ms"],
        retry_max_delay_ms=ints["retry_max_delay_ms"],
        prefetch=ints["prefetch"],
        concurrency=ints["concurrency"],
        postgres_pool_size=ints["postgres_pool_size"],
        postgres_statement_cache_size=statement_cache_size,
        shutdown_grace_seconds=ints["shutdown_grace_seconds"],
        metrics_interval_seconds=ints["metrics_interval_seconds"],
        fallbacks=tuple(fallbacks),
    )
