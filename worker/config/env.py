"""The settings and the environment: read by :func:`load_settings`, written by :func:`as_env` and
:func:`env_with`.

Integer settings follow the original bot's parse (``Number.parseInt``: leading digits count, so ``"12abc"``
is 12); a value that is not an integer > 0 falls back to the default. So does every other setting given a
value it does not take (a port that is no port, an unknown log format, level or tracing mode): each fallback
is recorded in ``Settings.fallbacks``, in declaration order, which ``worker run`` and ``worker migrate`` log
as warnings and ``worker check`` lists. The identity settings are ``strict``: a value they do not take is
refused (:func:`refused_settings`), and ``worker run``, ``worker check`` and ``worker dlq`` stop on it.
``Settings.notes`` holds the other warnings, listed the same way: a value read other than as written
(``12abc``), a Postgres DSN to another host without ``sslmode``, and every ``LTM_*`` variable no setting reads
(with the setting it probably meant).

Plain pydantic, not pydantic-settings: every variable's text goes through a rule that falls back with a
record instead of failing validation, ``load_settings`` reads any mapping (tests pass their own), the
``MAX_*`` limits are unprefixed variables of a nested model, and ``Settings()`` is the defaults, not the
environment. Those are the four things pydantic-settings would have to be bent around; what it would add,
reading ``os.environ``, is one line here.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from worker.config.rules import UNSET, Env, Invalid, Url
from worker.config.settings import Fallback, Note, Settings

__all__ = [
    "DeclaredSetting",
    "Env",
    "SettingsError",
    "as_env",
    "connection_problems",
    "declared",
    "env_of",
    "env_with",
    "expected_value",
    "load_settings",
    "overridden_env",
    "refused_settings",
    "unknown_variables",
    "variable_of",
]


@dataclass(frozen=True, slots=True)
class DeclaredSetting:
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


def _env_meta(field: FieldInfo) -> Env | None:
    return next((meta for meta in field.metadata if isinstance(meta, Env)), None)


def _walk(model: type[BaseModel], path: tuple[str, ...]) -> Iterator[DeclaredSetting]:
    for name, field in model.model_fields.items():
        env = _env_meta(field)
        if env is not None:
            yield DeclaredSetting((*path, name), env, field.default, field.description or "")
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            yield from _walk(field.annotation, (*path, name))


@cache
def declared() -> tuple[DeclaredSetting, ...]:
    """Every setting read from the environment, in declaration order (docs/configuration.md's table)."""
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


#: the most a ``_FILE`` secret may hold: a connection URL (or a list of them) is well under 1 KiB
MAX_SECRET_FILE_BYTES = 64 * 1024
_FILE_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def _read_file(env: Env, path: str) -> str:
    """The value in the file ``path`` (a secret mounted as a file), without its trailing line breaks.

    Only a regular file (a symlink to one, as Kubernetes mounts a Secret, is one) of at most
    :data:`MAX_SECRET_FILE_BYTES`: a FIFO would block the command, ``/dev/zero`` would fill the memory. It is
    opened without blocking and judged by what was opened, so a path swapped after a check cannot slip
    through. No message quotes the file's content."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise SettingsError(
            f"{env.file_var}: cannot read {path}: {exc.strerror or type(exc).__name__}"
        ) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = _FILE_KINDS.get(stat.S_IFMT(mode), "not a regular file")
        raise SettingsError(
            f"{env.file_var}: {path} is {kind}, not a regular file: name the file that holds the value"
        )
    with os.fdopen(fd, "rb") as file:
        data = file.read(MAX_SECRET_FILE_BYTES + 1)
    if len(data) > MAX_SECRET_FILE_BYTES:
        raise SettingsError(
            f"{env.file_var}: {path} is larger than {MAX_SECRET_FILE_BYTES // 1024} KiB; a secret file holds "
            "one connection URL: is it the right file?"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SettingsError(f"{env.file_var}: {path} is not UTF-8 text") from None
    value = text.rstrip("\r\n")
    if not value.strip():
        raise SettingsError(f"{env.file_var}: {path} is empty")
    return value


#: ``LTM_*`` variables of the tools around the worker, not settings of it: the test suites, the bench, the
#: test stacks, the README's demo, compose's images and host ports, the TypeScript kit's stack
_OTHER_TOOLS = re.compile(
    r"LTM_(TEST|BENCH|STACK|FUZZ|DEMO)(_.*)?|LTM_\w*_(IMAGE|HOST_PORT)|LTM_(WORKER_BIN|REQUIRE_DOCKER)"
    r"|LTM_CONTAINER_START_TIMEOUT"
)
#: prefixes of the settings without LTM_ (MAX_MEMORY_LENGTH, MEMORY_NOTICE_PREVIEW_LIMIT): a variable with one
#: is noted only when it is close to a setting's name (other programs use these prefixes too)
_UNPREFIXED = ("MAX_", "MEMORY_")


def unknown_variables(env: Mapping[str, str]) -> list[Note]:
    """A note per variable in ``env`` that looks like a setting but is none: every ``LTM_*`` one that no
    setting (or its ``_FILE`` form) reads and no other tool of the project uses, and a ``MAX_*``/``MEMORY_*``
    one close to a setting's name; each with the setting it probably meant. Never the value."""
    known = {s.var for s in declared()} | {s.env.file_var for s in declared() if s.env.file}
    notes: list[Note] = []
    for name in sorted(env):
        if name in known or _OTHER_TOOLS.fullmatch(name):
            continue
        if not name.startswith(("LTM_", *_UNPREFIXED)):
            continue
        near = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
        if near:
            notes.append((name, f"unknown setting {name}; did you mean {near[0]}?"))
        elif name.startswith("LTM_"):
            notes.append((name, f"unknown setting {name}: no setting reads it (`worker --help` lists them)"))
    return notes


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Build the settings from ``env`` (default: ``os.environ``); a value not taken falls back.

    A secret may come from the file its ``_FILE`` variable names instead (the file's text without its
    trailing line break); :class:`SettingsError` when both are set or the file cannot be read.
    """
    env = os.environ if env is None else env
    fallbacks: list[Fallback] = []
    notes: list[Note] = []
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
        except Invalid as invalid:
            fallbacks.append((setting.var, invalid.shown, setting.default))
            continue
        note = setting.env.rule.note(setting.var, raw, env)
        if note is not None:
            notes.append((setting.var, note))
        if value is not UNSET:
            *parents, name = setting.path
            target = values
            for parent in parents:
                target = target.setdefault(parent, {})
            target[name] = value
    notes += unknown_variables(env)
    return Settings.model_validate(
        {**values, "fallbacks": tuple(fallbacks), "notes": tuple(notes), "from_files": tuple(from_files)}
    )


def refused_settings(settings: Settings) -> dict[str, str]:
    """``{variable: why}`` for each ``strict`` setting given a value its rule does not take (the identity
    settings): such a value is refused, never replaced by its default, whose check is weaker than what was
    meant (``LTM_SHARD_IDENTITY=requried`` would run as ``checked``). One line naming the variable, the value
    given and what the setting takes; ``worker run`` stops on it (``cannot start``), ``worker check`` fails,
    ``worker dlq`` exits 2."""
    strict = {s.var: s for s in declared() if s.env.strict}
    refused: dict[str, str] = {}
    for var, raw, default in settings.fallbacks:
        if var in strict:
            refused[var] = (
                f"{var}={raw!r} is not {strict[var].env.rule.expected}; refused: this setting never falls "
                f"back to its default ({default!r}), which would check less than was meant"
            )
    return refused


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


def as_env(settings: Settings) -> dict[str, str]:
    """Every declared setting as the variable that gives it this value (for a worker process to start)."""
    env: dict[str, str] = {}
    for setting in declared():
        value: Any = settings
        for name in setting.path:
            value = getattr(value, name)
        env[setting.var] = str(value)
    return env


def env_of(**fields: object) -> dict[str, str]:
    """The variables that give the settings named ``fields`` these values (``postgres_dsn=dsn`` ->
    ``{"LTM_POSTGRES_DSN": dsn}``), the others left out; a name that is no declared setting is a
    ``TypeError``."""
    by_name = {s.path[-1]: s.var for s in declared()}
    unknown = sorted(set(fields) - set(by_name))
    if unknown:
        raise TypeError(f"not a declared setting: {', '.join(unknown)}")
    return {by_name[name]: str(value) for name, value in fields.items()}


def env_with(settings: Settings, **fields: object) -> dict[str, str]:
    """:func:`as_env` with the settings named ``fields`` (``prefetch=8``, ``max_server_memories=5``) given
    these values instead (:func:`env_of`)."""
    return as_env(settings) | env_of(**fields)


def overridden_env(env: Mapping[str, str], **fields: object) -> dict[str, str]:
    """``env`` with the settings named ``fields`` set through their variables (a ``None`` is no override);
    each such variable replaces its ``_FILE`` form too, as a command-line option does (worker/cli.py)."""
    merged = dict(env)
    for var, value in env_of(**{name: value for name, value in fields.items() if value is not None}).items():
        merged[var] = value
        merged.pop(f"{var}_FILE", None)
    return merged
