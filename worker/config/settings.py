"""The settings model: every field's default, meaning and (as :class:`Env` metadata) its variable.

:class:`Settings` nests :class:`Limits` (the ``MAX_*`` variables of SPEC.md) and :class:`Topology` (the
contract's names, not settings). ``Settings()`` is the defaults; reading the environment is
worker/config/env.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from contracts import names
from contracts.models import TOOL_NAMES
from worker.config.rules import (
    Choice,
    Duration,
    Env,
    NonNegativeInt,
    Port,
    PositiveInt,
    PostgresDsn,
    ShardUserFormat,
    Text,
    Url,
    UserNames,
    duration_seconds,
)

TracingMode = Literal["off", "otlp", "console"]
ShardIdentity = Literal["checked", "required", "shared"]
LogFormat = Literal["auto", "json", "console"]
LogLevel = Literal["debug", "info", "warning", "error"]

#: LTM_TRACING values (worker/observability/tracing.py)
TRACING_MODES: tuple[str, ...] = get_args(TracingMode)
#: LTM_LOG_FORMAT and LTM_LOG_LEVEL values (worker/observability/logs.py)
LOG_FORMATS: tuple[str, ...] = get_args(LogFormat)
LOG_LEVELS: tuple[str, ...] = get_args(LogLevel)
#: LTM_SHARD_IDENTITY values (worker/service/identity.py)
SHARD_IDENTITIES: tuple[str, ...] = get_args(ShardIdentity)
#: the RabbitMQ user each shard publishes as: ``shard-3`` for shard 3 (deploy/rabbitmq/shard_users.py)
DEFAULT_SHARD_USER = names.SHARD_USER

DEFAULT_POSTGRES_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
#: the schemes each client library takes (asyncpg, aio-pika, redis-py)
POSTGRES_SCHEMES = ("postgresql", "postgres")
AMQP_SCHEMES = ("amqp", "amqps")
REDIS_SCHEMES = ("redis", "rediss", "unix")
_KEYWORDS = (
    "a libpq keyword string (host=... password=...), which asyncpg does not take: write it as a "
    "postgresql:// URI (parameters such as sslmode go in its query)"
)
#: where the probe and metrics endpoint listens unless LTM_HTTP_HOST says otherwise: this host only
DEFAULT_HTTP_HOST = "127.0.0.1"

_MODEL = ConfigDict(frozen=True, extra="forbid")


class Limits(BaseModel):
    """Memory limits of SPEC.md (defaults of the current bot)."""

    model_config = _MODEL

    max_server_memories: Annotated[int, Env("MAX_SERVER_MEMORIES", PositiveInt())] = Field(
        100, gt=0, description="server-wide memories per `(server, persona lineage)`"
    )
    max_personal_memories: Annotated[int, Env("MAX_PERSONAL_MEMORIES", PositiveInt())] = Field(
        100, gt=0, description="personal memories per `(user, persona lineage)`, lineage 0 included"
    )
    max_memory_length: Annotated[int, Env("MAX_MEMORY_LENGTH", PositiveInt())] = Field(
        1000, gt=0, description="maximum memory length in UTF-16 code units"
    )
    notice_preview_limit: Annotated[int, Env("MEMORY_NOTICE_PREVIEW_LIMIT", PositiveInt())] = Field(
        600, gt=0, description="code points shown in the notice preview"
    )


@dataclass(frozen=True, slots=True)
class Topology:
    """Exchange, queue and channel names of CONTRACT.md. The defaults are the contract (not settings), written
    once in contracts/names.py."""

    tool_calls_exchange: str = names.TOOL_CALLS_EXCHANGE
    work_queue: str = names.WORK_QUEUE
    routing_keys: tuple[str, ...] = tuple(names.tool_routing_key(tool) for tool in TOOL_NAMES)
    results_exchange: str = names.TOOL_RESULTS_EXCHANGE
    notifications_exchange: str = names.NOTIFICATIONS_EXCHANGE
    dead_letter_exchange: str = names.DEAD_LETTER_EXCHANGE
    dead_letter_queue: str = names.DEAD_LETTER_QUEUE
    #: the copies the workers keep in Postgres (docs/dead-letters.md "Kept letters")
    dead_letter_copies_queue: str = names.DEAD_LETTER_COPIES_QUEUE
    retry_queue_prefix: str = names.RETRY_QUEUE_PREFIX
    #: each shard's own queue, ``ltm.create_memory.shard.<N>`` (docs/fair-shares.md)
    shard_queue_prefix: str = names.SHARD_WORK_QUEUE_PREFIX
    invalidation_channel: str = names.INVALIDATION_CHANNEL


#: a setting that fell back: (variable, the text given, the default used)
Fallback = tuple[str, str, int | str]
#: a setting read other than as written, or to be looked at, or a variable no setting has: (variable, the
#: sentence saying so, which never quotes a secret)
Note = tuple[str, str]


class Settings(BaseModel):
    """Everything the worker is configured with; ``Settings()`` holds the defaults."""

    model_config = _MODEL

    postgres_dsn: Annotated[
        str,
        Env(
            "LTM_POSTGRES_DSN",
            PostgresDsn(POSTGRES_SCHEMES, keywords=_KEYWORDS),
            "--postgres-dsn",
            file=True,
        ),
    ] = Field(
        DEFAULT_POSTGRES_DSN,
        description="Postgres connection string (libpq URI; the multi-host form "
        "`postgresql://u:p@pg-a,pg-b/db?target_session_attrs=read-write` works: docs/scaling-out.md)",
    )
    #: 0 (off) also works through a transaction-pooling PgBouncer, which a cache breaks (worker/store/pool.py)
    postgres_statement_cache_size: Annotated[
        int, Env("LTM_POSTGRES_STATEMENT_CACHE_SIZE", NonNegativeInt(), note="off")
    ] = Field(
        0,
        ge=0,
        description="asyncpg's prepared statements cached per connection; off works through a "
        "transaction-pooling PgBouncer, `100` saves Postgres CPU where the worker connects directly "
        "(docs/scaling-out.md)",
    )
    rabbitmq_url: Annotated[
        str, Env("LTM_RABBITMQ_URL", Url(AMQP_SCHEMES, listed=True), "--rabbitmq-url", file=True)
    ] = Field(
        DEFAULT_RABBITMQ_URL,
        description="AMQP URL, vhost included; for a cluster, one URL per node, comma-separated",
    )
    redis_url: Annotated[str, Env("LTM_REDIS_URL", Url(REDIS_SCHEMES), "--redis-url", file=True)] = Field(
        DEFAULT_REDIS_URL, description="Redis URL"
    )
    limits: Limits = Field(default_factory=Limits)
    retry_max_attempts: Annotated[int, Env("LTM_RETRY_MAX_ATTEMPTS", PositiveInt())] = Field(
        5, gt=0, description="processing attempts for a transient fault, the first included"
    )
    retry_base_delay_ms: Annotated[int, Env("LTM_RETRY_BASE_DELAY_MS", PositiveInt())] = Field(
        1000, gt=0, description="first retry delay; doubles per attempt"
    )
    retry_max_delay_ms: Annotated[int, Env("LTM_RETRY_MAX_DELAY_MS", PositiveInt())] = Field(
        60000, gt=0, description="cap of the retry delay"
    )
    prefetch: Annotated[int, Env("LTM_PREFETCH", PositiveInt(), "--prefetch")] = Field(
        8192,
        gt=0,
        description="deliveries of the common work queue RabbitMQ may push to one worker ahead of "
        "processing: the worker sorts what it holds by shard and serves the shards in turn "
        "(docs/fair-shares.md)",
    )
    shard_prefetch: Annotated[int, Env("LTM_SHARD_PREFETCH", PositiveInt())] = Field(
        32,
        gt=0,
        description="deliveries of each shard's own queue `ltm.create_memory.shard.<N>` RabbitMQ may push to "
        "one worker ahead of processing (docs/fair-shares.md)",
    )
    shard_queues_max: Annotated[int, Env("LTM_SHARD_QUEUES_MAX", PositiveInt())] = Field(
        200,
        gt=0,
        description="shards given a queue of their own, counted over every worker (rows of "
        "`ltm_shard_queues`): a shard earns one with its first event that passed the schema and the identity "
        "rule; the shards past it share the common work queue. 200 keeps a broker with Debian's file limit "
        "(1,024) a third below the 302 quorum queues it survives (docs/fair-shares.md)",
    )
    held_bytes_max: Annotated[int, Env("LTM_HELD_BYTES_MAX", PositiveInt())] = Field(
        128 * 1024 * 1024,
        gt=0,
        description="event bodies one worker holds at most (bytes), and one body more: past it, the worker "
        "stops consuming every queue (the common one and the shards' own) until half is processed or moved, "
        "and hands back unread what the broker had already pushed; the common queue's window is this divided "
        "by the largest body of the last minute, at most LTM_PREFETCH (docs/fair-shares.md)",
    )
    shard_identity: Annotated[
        ShardIdentity, Env("LTM_SHARD_IDENTITY", Choice(SHARD_IDENTITIES), strict=True)
    ] = Field(
        "checked",
        description="whether an event's RabbitMQ user may speak for its `shard_id`: `checked` (one shard's "
        "user may not speak for another shard; no `user_id`, or a user that is no shard's, is accepted as "
        "contract version 1 allows), `required` (it must be the shard's user or a trusted publisher; the "
        "shipped manifests), `shared` (not checked: one user for every shard); see docs/fair-shares.md. "
        "Any other value is refused (see below)",
    )
    shard_user: Annotated[str, Env("LTM_SHARD_USER", ShardUserFormat(), strict=True)] = Field(
        DEFAULT_SHARD_USER,
        description="the RabbitMQ user of shard N, with `{shard_id}` standing for N (the rule "
        "`LTM_SHARD_IDENTITY` checks); one without `{shard_id}` is refused",
    )
    trusted_publishers: Annotated[str, Env("LTM_TRUSTED_PUBLISHERS", UserNames(), strict=True)] = Field(
        "operator",
        description="RabbitMQ users, comma-separated, that may publish for any shard (`worker dlq replay` "
        "runs as one); a replay is checked against the sender recorded on the dead letter. Refused: an empty "
        "entry (`operator,`), a blank or unprintable character inside a name, a name over 255 bytes",
    )
    concurrency: Annotated[int, Env("LTM_CONCURRENCY", PositiveInt(), "--concurrency")] = Field(
        32, gt=0, description="events one worker processes at once"
    )
    postgres_pool_size: Annotated[int, Env("LTM_POSTGRES_POOL_SIZE", PositiveInt())] = Field(
        10,
        gt=0,
        description="Postgres connections per worker; at most this many batches of events are at Postgres "
        'at once (usually one: docs/decisions.md, "Batches")',
    )
    shutdown_grace_seconds: Annotated[
        int, Env("LTM_SHUTDOWN_GRACE_SECONDS", PositiveInt(), "--grace-seconds")
    ] = Field(30, gt=0, description="how long SIGTERM waits for in-flight events")
    http_port: Annotated[int, Env("LTM_HTTP_PORT", Port(), "--http-port", note="off")] = Field(
        0,
        ge=0,
        le=65535,
        description="port of `/healthz`, `/readyz`, `/metrics`: 0..65535, `0` or empty is off",
    )
    http_host: Annotated[str, Env("LTM_HTTP_HOST", Text(strip=True), "--http-host")] = Field(
        DEFAULT_HTTP_HOST,
        description="address that endpoint listens on; `0.0.0.0` for every interface (the container image, "
        "compose and the Kubernetes ConfigMap set it)",
    )
    #: sampled by worker/observability/sampler.py
    metrics_interval_seconds: Annotated[int, Env("LTM_METRICS_INTERVAL_SECONDS", PositiveInt())] = Field(
        15,
        gt=0,
        description="how often a worker with the HTTP port on samples queue depths and dependency state "
        "for `/metrics`",
    )
    log_format: Annotated[LogFormat, Env("LTM_LOG_FORMAT", Choice(LOG_FORMATS), "--log-format")] = Field(
        "auto", description="`json`, `console`, or `auto` (console on a terminal, JSON otherwise)"
    )
    log_level: Annotated[LogLevel, Env("LTM_LOG_LEVEL", Choice(LOG_LEVELS), "--log-level")] = Field(
        "info", description="`debug`, `info`, `warning` or `error`; `debug` also logs memory contents"
    )
    tracing: Annotated[TracingMode, Env("LTM_TRACING", Choice(TRACING_MODES), "--tracing")] = Field(
        "off",
        description="`otlp` (configured by the `OTEL_EXPORTER_OTLP_*` variables) or `console`: an "
        "OpenTelemetry span per event (needs the `tracing` extra, from the worker's checkout: "
        "`pip install -e '/path/to/checkout[tracing]'`)",
    )
    dlq_retention: Annotated[str, Env("LTM_DLQ_RETENTION", Duration(), "--retention")] = Field(
        "14d",
        description="how long dead letters are kept (`14d`, `36h`, `1h30m`): `worker dlq expire`, and the "
        "workers' retention sweep, remove from the DLQ the letters that failed longer ago and from "
        "`ltm_dead_letters` the rows of such letters, on record; 14 days is SQS's longest "
        '(docs/dead-letters.md "Retention")',
    )
    dlq_retention_sweep: Annotated[str, Env("LTM_DLQ_RETENTION_SWEEP", Duration(off=True))] = Field(
        "1h",
        description="how often the workers run the retention sweep (`worker dlq expire --by retention`): one "
        "worker of the fleet at a time, the others skip it; `0` or `off`: never, run `worker dlq expire` "
        "yourself",
    )
    topology: Topology = Field(default_factory=Topology)
    #: settings that were given but invalid, as (variable, raw value, default used); those of a ``strict``
    #: setting are refused (worker/config/env.py ``refused_settings``), the default only stands in
    fallbacks: tuple[Fallback, ...] = ()
    #: warnings about settings taken (``3O`` read as 3, a DSN without sslmode) and unknown ``LTM_*`` variables
    notes: tuple[Note, ...] = ()
    #: the variables whose value was read from the file their ``_FILE`` variable names
    from_files: tuple[str, ...] = ()

    @field_validator("dlq_retention", "dlq_retention_sweep")
    @classmethod
    def _a_duration(cls, value: str, info: ValidationInfo) -> str:
        """A duration given in code is checked (the variables' text is read by :class:`Duration`)."""
        if duration_seconds(value) == 0 and info.field_name == "dlq_retention":
            raise ValueError("the retention must be longer than 0")
        return value

    @property
    def dlq_retention_seconds(self) -> int:
        """``LTM_DLQ_RETENTION`` in seconds."""
        return duration_seconds(self.dlq_retention)

    @property
    def dlq_retention_sweep_seconds(self) -> int:
        """``LTM_DLQ_RETENTION_SWEEP`` in seconds (0: off)."""
        return duration_seconds(self.dlq_retention_sweep)
