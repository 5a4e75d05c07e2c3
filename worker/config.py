"""Settings from the environment, read once at start-up into one typed object.

One declaration: each field of :class:`Settings` (and of :class:`Limits`, whose fields it nests) carries its
default, its meaning (``description``, the README's configuration table, checked by
tests/unit/test_settings_declaration.py) and, as :class:`Env` metadata, its variable, how the variable's text
is read, and the ``worker run`` option that overrides it. ``load_settings``, the CLI's overrides and help,
``Settings.as_env`` and the README table all come from it.

Integer settings follow the original bot's parse (``Number.parseInt``: leading digits count, so ``"12abc"``
is 12); a value that is not an integer > 0 falls back to the default. So does every other setting given a
value it does not take (a port that is no port, an unknown log format, level or tracing mode): each fallback
is recorded in ``Settings.fallbacks``, in declaration order, which ``worker run`` and ``worker migrate`` log
as warnings and ``worker check`` lists.

Plain pydantic, not pydantic-settings: every variable's text goes through a rule that falls back with a
record instead of failing validation, ``load_settings`` reads any mapping (tests pass their own), the
``MAX_*`` limits are unprefixed variables of a nested model, and ``Settings()`` is the defaults, not the
environment. Those are the four things pydantic-settings would have to be bent around; what it would add,
reading ``os.environ``, is one line here.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

TracingMode = Literal["off", "otlp", "console"]
LogFormat = Literal["auto", "json", "console"]
LogLevel = Literal["debug", "info", "warning", "error"]

#: LTM_TRACING values (worker/observability/tracing.py)
TRACING_MODES: tuple[str, ...] = get_args(TracingMode)
#: LTM_LOG_FORMAT and LTM_LOG_LEVEL values (worker/observability/logs.py)
LOG_FORMATS: tuple[str, ...] = get_args(LogFormat)
LOG_LEVELS: tuple[str, ...] = get_args(LogLevel)

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


#: where a URL starts in a text: at its start, or after a comma (a list of nodes), a blank, a quote, ``=`` or
#: an opening bracket; not after a ``:``, so ``amqp://u:ab://c@h`` is one URL whose password holds ``://``
_URL_START = re.compile(r"(?:^|(?<=[\s,'\"(=<\[]))[A-Za-z][A-Za-z0-9+.-]*://")
#: a parameter holding a secret, in a URL's query (libpq's and redis-py's ``?password=``, libpq's
#: ``sslpassword``) or a libpq keyword string (``host=a password='x y'``): its value runs to the next ``&``,
#: blank or listed URL (a ``#``, ``/`` or ``@`` in it does not end it)
_SECRET_PARAM = re.compile(
    r"((?:^|(?<=[?&;\s]))[\w.-]{0,64}(?:pass|pwd|secret|token)[\w.-]{0,64}\s*=\s*)"
    r"('(?:[^'\\]|\\.)*'?|(?:(?!&|\s|,\s*[A-Za-z][A-Za-z0-9+.-]*://).)*)",
    re.IGNORECASE,
)


def redact_url(text: str) -> str:
    """``text`` with every password it holds replaced by ``***``, for every output (logs, ``worker check``,
    errors): the one redaction of the worker.

    A password in a URL's userinfo (``amqp://u:***@h/``), written in a query (``?password=***``,
    ``&sslpassword=***``) or as a libpq keyword (``password=***``); in a comma-separated list of URLs (several
    RabbitMQ nodes), a libpq multi-host URI (``postgresql://u:p@a,b/db``) and any text that quotes URLs (an
    error message). The userinfo of a URL runs to its *last* ``@`` (up to the next URL of a list), so a
    password holding an unencoded ``/``, ``?``, ``#`` or ``@`` is hidden whole: the URL parsers would split it
    elsewhere, and a malformed URL is refused (:func:`url_problem`) but still shown this way. An ``@`` in a
    query value (``?application_name=a@b``) hides more than the password: never less.
    """
    starts = list(_URL_START.finditer(text))
    if starts:
        pieces = [text[: starts[0].start()]]
        for n, start in enumerate(starts):
            end = starts[n + 1].start() if n + 1 < len(starts) else len(text)
            pieces.append(start.group() + _redact_userinfo(text[start.end() : end]))
        text = "".join(pieces)
    return _SECRET_PARAM.sub(r"\1***", text)


def _redact_userinfo(rest: str) -> str:
    """What follows ``scheme://``, the password of its userinfo hidden (nothing to hide without one)."""
    at = rest.rfind("@")
    if at < 0:
        return rest
    user, colon, _ = rest[:at].partition(":")
    return f"{user}:***{rest[at:]}" if colon else rest


def _port_text(host: str) -> str | None:
    """The port written after ``host`` (``[::1]:5432``, ``pg-a:5432``), or None when none is."""
    if host.startswith("["):
        _, bracket, after = host.partition("]")
        return after[1:] if bracket and after.startswith(":") else None
    _, colon, port = host.rpartition(":")
    return port if colon else None


def url_problem(text: str, schemes: tuple[str, ...], *, hosts_listed: bool = False) -> str | None:
    """Why ``text`` is not one URL of ``schemes`` that the client libraries read as written, or None.

    Never quotes ``text``: what a password with an unencoded ``/``, ``?``, ``#`` or ``@`` spills into (a
    port, a path, a fragment, a host) is what the libraries' own errors quote (``invalid literal for int()
    with base 10: 'S3c'``). ``hosts_listed``: a libpq multi-host URI (``postgresql://u:p@a:5432,b:5433/db``).
    """
    scheme, sep, rest = text.strip().partition("://")
    wanted = " or ".join(f"{s}://" for s in schemes)
    if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
        return f"not a URL (expected {wanted}...)"
    if scheme.lower() not in schemes:
        return f"the scheme is not {wanted}"
    if "#" in rest:
        return "it holds a `#` (a fragment, which no connection URL has)"
    authority = re.split(r"[/?]", rest, maxsplit=1)[0]
    path, _, query = rest[len(authority) :].partition("?")
    if authority.count("@") > 1:
        return "more than one `@` before the host"
    hosts = authority.rpartition("@")[2]
    for host in hosts.split(",") if hosts_listed else [hosts]:
        port = _port_text(host)
        if port and not (port.isascii() and port.isdigit() and 0 < int(port) <= 65535):
            return "a port that is not a number 1..65535"
    if "@" in path or any("@" in field.partition("=")[0] for field in query.split("&")):
        return "an `@` after the host"
    return None


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


# --- how a variable's text is read ---------------------------------------------------------------------


class _Invalid(Exception):
    """The text is not a value the setting takes; ``shown`` is the text the fallback records."""

    def __init__(self, shown: str) -> None:
        super().__init__(shown)
        self.shown = shown


#: what a rule returns for "not set": the field's default, no fallback
_UNSET: Any = object()


class Rule:
    """How one variable's text becomes a value; ``expected`` says what it takes, for the fallback message."""

    expected = "a valid value"

    def read(self, raw: str) -> Any:
        """The value of ``raw``, or ``_UNSET`` (use the default); raises ``_Invalid`` to fall back."""
        raise NotImplementedError


class Text(Rule):
    """Taken as written (``strip``: without surrounding blanks); empty is the default. Never falls back."""

    def __init__(self, *, strip: bool = False) -> None:
        self.strip = strip

    def read(self, raw: str) -> Any:
        text = raw.strip() if self.strip else raw
        return text or _UNSET


class Url(Text):
    """A connection URL, taken as written like :class:`Text`; :meth:`problem` says why it can never work.

    ``listed``: one URL or several, comma-separated (the nodes of a RabbitMQ cluster); ``hosts_listed``: a
    libpq multi-host URI. ``keywords``: what to say about a string of ``key=value`` words (libpq's keyword
    form, which asyncpg does not take).
    """

    def __init__(
        self,
        schemes: tuple[str, ...],
        *,
        listed: bool = False,
        hosts_listed: bool = False,
        keywords: str | None = None,
    ) -> None:
        super().__init__()
        self.schemes = schemes
        self.listed = listed
        self.hosts_listed = hosts_listed
        self.keywords = keywords

    def problem(self, value: str) -> str | None:
        """Why ``value`` can never work as this setting (never quoting it), or None."""
        if self.keywords and "://" not in value and "=" in value:
            return self.keywords
        urls = [part.strip() for part in value.split(",")] if self.listed else [value]
        if not any(urls):
            return "no URL given"
        for url in urls:
            problem = url_problem(url, self.schemes, hosts_listed=self.hosts_listed)
            if problem is not None:
                return (
                    f"{problem}; percent-encode any `/` `?` `#` `@` `,` in a password (%2F %3F %23 %40 %2C)"
                )
        return None


class PositiveInt(Rule):
    """The bot's ``parseInt`` rule: leading digits count; anything but an integer > 0 falls back."""

    expected = "an integer > 0"

    def read(self, raw: str) -> Any:
        value, fell_back = parse_positive_int(raw, 0)
        if fell_back:
            raise _Invalid(raw)
        return value or _UNSET


class NonNegativeInt(Rule):
    """Digits only, 0 included (0 is the useful value: off); empty is the default."""

    expected = "an integer >= 0 (0: off)"

    def read(self, raw: str) -> Any:
        text = raw.strip()
        if not text:
            return _UNSET
        if not (text.isascii() and text.isdigit()):
            raise _Invalid(text)
        return int(text)


class Port(Rule):
    """A TCP port 0..65535; 0 or empty is off."""

    expected = "a port number 0..65535 (0 or empty: off)"

    def read(self, raw: str) -> Any:
        port = parse_port(raw)
        if port is None:
            raise _Invalid(raw)
        return port


class Choice(Rule):
    """One of a few words, any case, blanks around ignored; empty is the default."""

    def __init__(self, choices: tuple[str, ...]) -> None:
        self.choices = choices
        self.expected = "one of " + ", ".join(choices)

    def read(self, raw: str) -> Any:
        value = raw.strip().lower()
        if not value:
            return _UNSET
        if value not in self.choices:
            raise _Invalid(raw)
        return value


@dataclass(frozen=True, slots=True)
class Env:
    """Field metadata: the variable a setting is read from, how, and the ``worker run`` option, if any.

    ``note`` follows the default in the README table (``0`` (off)). ``file``: a secret, which may also be read
    from the file that ``<var>_FILE`` names (as the official images of Postgres, RabbitMQ and Redis do).
    """

    var: str
    rule: Rule
    option: str | None = None
    note: str | None = None
    file: bool = False

    @property
    def file_var(self) -> str:
        """``LTM_POSTGRES_DSN_FILE``: the variable naming a file that holds the value."""
        return f"{self.var}_FILE"


@dataclass(frozen=True, slots=True)
class Declared:
    """One setting as declared: where it sits (``path``: field names from Settings down), its variable, rule,
    option, default and meaning."""

    path: tuple[str, ...]
    env: Env
    default: Any
    description: str

    @property
    def var(self) -> str:
        return self.env.var

    @property
    def shown_default(self) -> str:
        """The default for people: ``0 (off)``."""
        return f"{self.default} ({self.env.note})" if self.env.note else str(self.default)

    @property
    def table_row(self) -> str:
        """The setting's row of the README table: variable, default (`` `0` (off) ``), meaning."""
        default = f"`{self.default}` ({self.env.note})" if self.env.note else f"`{self.default}`"
        variable = f"`{self.var}` or `{self.env.file_var}`" if self.env.file else f"`{self.var}`"
        return f"| {variable} | {default} | {self.description} |"


# --- the declaration -------------------------------------------------------------------------------------

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
    """Exchange, queue and channel names of CONTRACT.md. The defaults are the contract (not settings)."""

    tool_calls_exchange: str = "tomori.tool_calls"
    work_queue: str = "ltm.create_memory"
    routing_keys: tuple[str, ...] = ("tool.create_long_term_memory", "tool.remember_this_fact")
    results_exchange: str = "tomori.tool_results"
    notifications_exchange: str = "tomori.notifications"
    dead_letter_exchange: str = "tomori.dead_letter"
    dead_letter_queue: str = "ltm.create_memory.dlq"
    retry_queue_prefix: str = "ltm.create_memory.retry"
    invalidation_channel: str = "tomori:cache-invalidation"


#: a setting that fell back: (variable, the text given, the default used)
Fallback = tuple[str, str, int | str]


class Settings(BaseModel):
    """Everything the worker is configured with; ``Settings()`` holds the defaults."""

    model_config = _MODEL

    postgres_dsn: Annotated[
        str,
        Env(
            "LTM_POSTGRES_DSN",
            Url(POSTGRES_SCHEMES, hosts_listed=True, keywords=_KEYWORDS),
            "--postgres-dsn",
            file=True,
        ),
    ] = Field(
        DEFAULT_POSTGRES_DSN,
        description="Postgres connection string (libpq URI; the multi-host form "
        '`postgresql://u:p@pg-a,pg-b/db?target_session_attrs=read-write` works, see "Past one machine")',
    )
    #: 0 (off) also works through a transaction-pooling PgBouncer, which a cache breaks (worker/store/pool.py)
    postgres_statement_cache_size: Annotated[
        int, Env("LTM_POSTGRES_STATEMENT_CACHE_SIZE", NonNegativeInt(), note="off")
    ] = Field(
        0,
        ge=0,
        description="asyncpg's prepared statements cached per connection; off works through a "
        "transaction-pooling PgBouncer, `100` saves Postgres CPU where the worker connects directly "
        '(see "Past one machine")',
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
        64, gt=0, description="deliveries RabbitMQ may push to one worker ahead of processing"
    )
    concurrency: Annotated[int, Env("LTM_CONCURRENCY", PositiveInt(), "--concurrency")] = Field(
        32, gt=0, description="events one worker processes at once"
    )
    postgres_pool_size: Annotated[int, Env("LTM_POSTGRES_POOL_SIZE", PositiveInt())] = Field(
        10,
        gt=0,
        description="Postgres connections per worker; at most this many batches of events are at Postgres "
        'at once (usually one: see "Batches" below)',
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
        "OpenTelemetry span per event (needs "
        "`pip install 'tomoribot-ltm-worker[tracing]'`)",
    )
    topology: Topology = Field(default_factory=Topology)
    #: settings that were given but invalid, as (variable, raw value, default used)
    fallbacks: tuple[Fallback, ...] = ()
    #: the variables whose value was read from the file their ``_FILE`` variable names
    from_files: tuple[str, ...] = ()

    def as_env(self) -> dict[str, str]:
        """Every declared setting as the variable that gives it this value (for a worker process to start)."""
        env: dict[str, str] = {}
        for setting in declared():
            value: Any = self
            for name in setting.path:
                value = getattr(value, name)
            env[setting.var] = str(value)
        return env


def _env_of(field: FieldInfo) -> Env | None:
    return next((meta for meta in field.metadata if isinstance(meta, Env)), None)


def _walk(model: type[BaseModel], path: tuple[str, ...]) -> Iterator[Declared]:
    for name, field in model.model_fields.items():
        env = _env_of(field)
        if env is not None:
            yield Declared((*path, name), env, field.default, field.description or "")
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            yield from _walk(field.annotation, (*path, name))


@cache
def declared() -> tuple[Declared, ...]:
    """Every setting read from the environment, in declaration order (the README table's order)."""
    return tuple(_walk(Settings, ()))


def variable_of(field: str) -> str:
    """The variable of the setting named ``field`` (``prefetch`` -> ``LTM_PREFETCH``), for option maps."""
    return next(s.var for s in declared() if s.path[-1] == field)


def expected_value(var: str) -> str:
    """What the setting ``var`` takes, in words (for the message about a value that fell back)."""
    return next((s.env.rule.expected for s in declared() if s.var == var), "a valid value")


class SettingsError(ValueError):
    """A setting that cannot be read at all (a ``_FILE`` variable: both forms set, the file unreadable or
    empty); the message names the variables and the path, never a value."""


def _read_file(env: Env, path: str) -> str:
    """The value in the file ``path`` (a secret mounted as a file), without its trailing line breaks."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(
            f"{env.file_var}: cannot read {path}: {exc.strerror or type(exc).__name__}"
        ) from None
    except UnicodeDecodeError:
        raise SettingsError(f"{env.file_var}: {path} is not UTF-8 text") from None
    value = text.rstrip("\r\n")
    if not value.strip():
        raise SettingsError(f"{env.file_var}: {path} is empty")
    return value


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Build the settings from ``env`` (default: ``os.environ``); a value not taken falls back.

    A secret may come from the file its ``_FILE`` variable names instead (the file's text without its
    trailing line break); :class:`SettingsError` when both are set or the file cannot be read.
    """
    env = os.environ if env is None else env
    fallbacks: list[Fallback] = []
    from_files: list[str] = []
    values: dict[str, Any] = {}
    for setting in declared():
        raw = env.get(setting.var)
        path = env.get(setting.env.file_var) if setting.env.file else None
        if path:
            if raw:
                raise SettingsError(
                    f"{setting.var} and {setting.env.file_var} are both set: set only one "
                    f"({setting.env.file_var} names a file holding the value)"
                )
            raw = _read_file(setting.env, path)
            from_files.append(setting.var)
        if raw is None:
            continue
        try:
            value = setting.env.rule.read(raw)
        except _Invalid as invalid:
            fallbacks.append((setting.var, invalid.shown, setting.default))
            continue
        if value is not _UNSET:
            *parents, name = setting.path
            target = values
            for parent in parents:
                target = target.setdefault(parent, {})
            target[name] = value
    return Settings.model_validate({**values, "fallbacks": tuple(fallbacks), "from_files": tuple(from_files)})


def connection_problems(settings: Settings, *fields: str) -> dict[str, str]:
    """``{field: why}`` for each connection setting among ``fields`` (all when none are named) whose URL can
    never work: one line naming the variable (and the file variable it came from), never the value."""
    problems: dict[str, str] = {}
    for setting in declared():
        name = setting.path[-1]
        if not isinstance(setting.env.rule, Url) or (fields and name not in fields):
            continue
        problem = setting.env.rule.problem(getattr(settings, name))
        if problem is not None:
            source = setting.var
            if setting.var in settings.from_files:
                source = f"{setting.var} (read from {setting.env.file_var})"
            problems[name] = f"{source} is not a valid connection URL: {problem}"
    return problems


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


def configuration_table() -> str:
    """The README's configuration table (variable, default, meaning), one row per declared setting."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    rows += [s.table_row for s in declared()]
    return "\n".join(rows)


def environment_help(*fields: str) -> str:
    """The epilog of a command: each variable it reads (every one when no ``fields`` are named) and its
    default, from the settings' declaration."""
    settings = tuple(s for s in declared() if not fields or s.path[-1] in fields)
    width = max(len(s.var) for s in settings) + 2
    lines = [
        "configuration comes from the environment (see the README for the full table)"
        + (", this command reads:" if fields else ":")
    ]
    lines += [f"  {s.var:<{width}}default {s.shown_default}" for s in settings]
    files = [s for s in settings if s.env.file]
    lines += [
        "command-line options override the environment; a value a setting does not take falls back to its",
        "default with a warning (`worker check` lists them).",
    ]
    if files:
        lines += [
            f"{', '.join(s.var for s in files)} may be given as <VARIABLE>_FILE instead: the path",
            "of a file holding the value (a mounted secret; its trailing line break dropped); both is an "
            "error.",
        ]
    return "\n" + "\n".join(lines) + "\n"
