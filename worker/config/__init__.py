"""Settings from the environment, read once at start-up into one typed object.

One declaration: each field of :class:`Settings` (and of :class:`Limits`, whose fields it nests) carries its
default, its meaning (``description``, the table of docs/configuration.md, checked by
tests/unit/test_settings_declaration.py) and, as :class:`Env` metadata, its variable, how the variable's text
is read, and the ``worker run`` option that overrides it. ``load_settings``, the CLI's overrides and help
(worker/cli.py), ``as_env``/``env_with`` and the configuration table all come from it.

- settings.py: the model (:class:`Settings`, :class:`Limits`, :class:`Topology`) and its defaults;
- rules.py: how a variable's text is read (the rules, :class:`Env`);
- env.py: the environment read (:func:`load_settings`) and written (:func:`as_env`, :func:`env_with`,
  :func:`env_of`, :func:`overridden_env`): the one place that knows the variables' names;
- render.py: the configuration table (docs/configuration.md) and the commands' epilogs
  (``python -m worker.config`` prints the table).
"""

from worker.config.env import (
    DeclaredSetting,
    SettingsError,
    as_env,
    connection_problems,
    declared,
    env_of,
    env_with,
    expected_value,
    load_settings,
    overridden_env,
    refused_settings,
    unknown_variables,
    variable_of,
)
from worker.config.render import configuration_table, environment_help
from worker.config.rules import (
    Env,
    duration_seconds,
    parse_port,
    parse_positive_int,
    url_problem,
)
from worker.config.settings import (
    AMQP_SCHEMES,
    DEFAULT_HTTP_HOST,
    DEFAULT_POSTGRES_DSN,
    DEFAULT_RABBITMQ_URL,
    DEFAULT_REDIS_URL,
    LOG_FORMATS,
    LOG_LEVELS,
    POSTGRES_SCHEMES,
    REDIS_SCHEMES,
    TRACING_MODES,
    Fallback,
    Limits,
    LogFormat,
    LogLevel,
    Note,
    Settings,
    Topology,
    TracingMode,
)

__all__ = [
    "AMQP_SCHEMES",
    "DEFAULT_HTTP_HOST",
    "DEFAULT_POSTGRES_DSN",
    "DEFAULT_RABBITMQ_URL",
    "DEFAULT_REDIS_URL",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "POSTGRES_SCHEMES",
    "REDIS_SCHEMES",
    "TRACING_MODES",
    "DeclaredSetting",
    "Env",
    "Fallback",
    "Limits",
    "LogFormat",
    "LogLevel",
    "Note",
    "Settings",
    "SettingsError",
    "Topology",
    "TracingMode",
    "as_env",
    "configuration_table",
    "connection_problems",
    "declared",
    "duration_seconds",
    "env_of",
    "env_with",
    "environment_help",
    "expected_value",
    "load_settings",
    "overridden_env",
    "parse_port",
    "parse_positive_int",
    "refused_settings",
    "unknown_variables",
    "url_problem",
    "variable_of",
]
