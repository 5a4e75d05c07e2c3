"""How a variable's text becomes a setting's value, and the :class:`Env` metadata that names the variable.

A rule falls back instead of failing: a value it does not take raises :class:`Invalid` with the text the
fallback records, and "not set" is :data:`UNSET` (the field's default). A setting declared ``strict``
(:class:`Env`) is refused on such a value instead: the commands that use it stop. A value it takes, but not as
written (``LTM_CONCURRENCY=3O`` is 3), or one that works but should not be left so (a Postgres DSN to
another host without ``sslmode``), gets a note (:meth:`Rule.note`): a warning, never a failure. The
connection URLs are checked by :func:`url_problem`, which never quotes the URL (a password may spill into any
part of it).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote


def _port_text(host: str) -> str | None:
    """The port written after ``host`` (``[::1]:5432``, ``pg-a:5432``), or None when none is."""
    if host.startswith("["):
        _, bracket, after = host.partition("]")
        return after[1:] if bracket and after.startswith(":") else None
    _, colon, port = host.rpartition(":")
    return port if colon else None


#: the problems of :func:`url_problem` that a password with an unencoded ``/`` ``?`` ``#`` ``@`` ``,`` makes
#: (the parsers read a fragment, a second ``@``, a port or a host out of it): only these get the advice
FRAGMENT = "it holds a `#` (a fragment, which no connection URL has)"
TWO_ATS = "more than one `@` before the host"
BAD_PORT = "a port that is not a number 1..65535"
AT_AFTER_HOST = "an `@` after the host"
PASSWORD_SPILLS = (FRAGMENT, TWO_ATS, BAD_PORT, AT_AFTER_HOST)
PERCENT_ENCODE = "percent-encode any `/` `?` `#` `@` `,` in a password (%2F %3F %23 %40 %2C)"


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
        return FRAGMENT
    authority = re.split(r"[/?]", rest, maxsplit=1)[0]
    path, _, query = rest[len(authority) :].partition("?")
    if authority.count("@") > 1:
        return TWO_ATS
    hosts = authority.rpartition("@")[2]
    for host in hosts.split(",") if hosts_listed else [hosts]:
        port = _port_text(host)
        if port and not (port.isascii() and port.isdigit() and 0 < int(port) <= 65535):
            return BAD_PORT
    if "@" in path or any("@" in field.partition("=")[0] for field in query.split("&")):
        return AT_AFTER_HOST
    return None


_LEADING_INT = re.compile(r"^\s*([+-]?\d+)")
_WHOLE_INT = re.compile(r"^\s*[+]?\d+\s*$")


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


class Invalid(Exception):
    """The text is not a value the setting takes; ``shown`` is the text the fallback records."""

    def __init__(self, shown: str) -> None:
        super().__init__(shown)
        self.shown = shown


#: what a rule returns for "not set": the field's default, no fallback
UNSET: Any = object()


class Rule:
    """How one variable's text becomes a value; ``expected`` says what it takes, for the fallback message."""

    expected = "a valid value"

    def read(self, raw: str) -> Any:
        """The value of ``raw``, or ``UNSET`` (use the default); raises ``Invalid`` to fall back."""
        raise NotImplementedError

    def note(self, var: str, raw: str, env: Mapping[str, str]) -> str | None:
        """A warning about ``raw``, a text :meth:`read` took (``var`` names it; ``env`` is the environment it
        came from), or None. Never quotes a value that may hold a secret."""
        return None


class Text(Rule):
    """Taken as written (``strip``: without surrounding blanks); empty is the default. Never falls back."""

    def __init__(self, *, strip: bool = False) -> None:
        self.strip = strip

    def read(self, raw: str) -> Any:
        text = raw.strip() if self.strip else raw
        return text or UNSET


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
                # the advice only where a password can be the cause, not for a misspelt scheme
                return f"{problem}; {PERCENT_ENCODE}" if problem in PASSWORD_SPILLS else problem
        return None


#: the ``sslmode`` values that verify nothing and may go on in plaintext without a word (asyncpg's default is
#: ``prefer``, as libpq's)
_UNVERIFIED_SSLMODES = ("prefer", "allow")


class PostgresDsn(Url):
    """A Postgres DSN (libpq URI, several hosts allowed): noted when it reaches a host other than this one
    without saying ``sslmode`` (or saying ``prefer``/``allow``): nothing is verified, and a server (or whoever
    sits between) that offers no TLS gets plaintext without a word. ``sslmode=disable`` chooses plaintext in
    the open and is not noted, nor is a loopback host, a Unix socket or a name that does not resolve (a typo:
    the connection's own error says so, and TLS is beside the point)."""

    def __init__(self, schemes: tuple[str, ...], *, keywords: str | None = None) -> None:
        super().__init__(schemes, hosts_listed=True, keywords=keywords)

    def note(self, var: str, raw: str, env: Mapping[str, str]) -> str | None:
        if self.problem(raw) is not None:
            return None  # refused on its own, with its own line
        rest = raw.strip().partition("://")[2]
        authority = re.split(r"[/?]", rest, maxsplit=1)[0]
        query = parse_qs(rest[len(authority) :].partition("?")[2])
        sslmode = (query.get("sslmode") or [env.get("PGSSLMODE", "")])[-1].strip().lower() or "prefer"
        if sslmode not in _UNVERIFIED_SSLMODES:
            return None
        hosts = [_host_name(h) for h in authority.rpartition("@")[2].split(",") if h]
        hosts += [h for value in query.get("host", []) for h in value.split(",") if h]
        if not hosts and env.get("PGHOST"):
            hosts = env["PGHOST"].split(",")
        remote = next((h for h in hosts if not _is_local(h) and _resolves(h)), None)
        if remote is None:
            return None
        given = "sslmode" in query or "PGSSLMODE" in env
        said = f"with sslmode={sslmode}" if given else "without sslmode"
        return (
            f"{var} reaches {remote!r} {said}: the server is not verified, and without TLS on offer the "
            "connection goes on in plaintext without a word; say sslmode=verify-full "
            "(docs/tls.md), or sslmode=disable to choose plaintext in the open"
        )


def _host_name(host: str) -> str:
    """The host of ``host[:port]`` or ``[v6]:port``, percent-decoded."""
    if host.startswith("["):
        return unquote(host[1:].partition("]")[0])
    return unquote(host.rpartition(":")[0] if ":" in host else host)


def _resolves(host: str) -> bool:
    """Whether ``host`` is an address, or a name this machine resolves now."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    try:
        return bool(socket.getaddrinfo(host, None))
    except (OSError, UnicodeError):
        return False


def _is_local(host: str) -> bool:
    """This machine: a Unix socket directory, ``localhost``, a loopback address."""
    if host.startswith("/") or host.lower() in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class PositiveInt(Rule):
    """The bot's ``parseInt`` rule: leading digits count; anything but an integer > 0 falls back. Text after
    the digits (``3O``: a letter O) is noted: the value is the bot's, but it is rarely what was meant."""

    expected = "an integer > 0"

    def read(self, raw: str) -> Any:
        value, fell_back = parse_positive_int(raw, 0)
        if fell_back:
            raise Invalid(raw)
        return value or UNSET

    def note(self, var: str, raw: str, env: Mapping[str, str]) -> str | None:
        if not raw.strip() or _WHOLE_INT.match(raw):
            return None
        value, _ = parse_positive_int(raw, 0)
        return f"{var}={raw!r} read as {value} (the text after the digits is ignored, as parseInt does)"


class NonNegativeInt(Rule):
    """Digits only, 0 included (0 is the useful value: off); empty is the default."""

    expected = "an integer >= 0 (0: off)"

    def read(self, raw: str) -> Any:
        text = raw.strip()
        if not text:
            return UNSET
        if not (text.isascii() and text.isdigit()):
            raise Invalid(text)
        return int(text)


class Port(Rule):
    """A TCP port 0..65535; 0 or empty is off."""

    expected = "a port number 0..65535 (0 or empty: off)"

    def read(self, raw: str) -> Any:
        port = parse_port(raw)
        if port is None:
            raise Invalid(raw)
        return port


class Choice(Rule):
    """One of a few words, any case, blanks around ignored; empty is the default."""

    def __init__(self, choices: tuple[str, ...]) -> None:
        self.choices = choices
        self.expected = "one of " + ", ".join(choices)

    def read(self, raw: str) -> Any:
        value = raw.strip().lower()
        if not value:
            return UNSET
        if value not in self.choices:
            raise Invalid(raw)
        return value


class ShardUserFormat(Rule):
    """The user name of shard N with ``{shard_id}`` for N, exactly once, in a name RabbitMQ takes."""

    expected = "a user name with {shard_id} in it once (shard-{shard_id})"

    def read(self, raw: str) -> Any:
        text = raw.strip()
        if not text:
            return UNSET
        prefix, marker, suffix = text.partition("{shard_id}")
        if not marker or "{" in prefix + suffix or "}" in prefix + suffix or len(text) > 200:
            raise Invalid(raw)
        return text


_DURATION_PART = re.compile(r"(\d+)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration_seconds(text: str) -> int:
    """``30s``, ``10m``, ``2h``, ``14d``, ``1w`` or a sum such as ``1h30m`` in seconds (``0``: 0); ValueError
    otherwise (the same words as ``worker dlq --older-than``)."""
    compact = text.strip().lower()
    if compact == "0":
        return 0
    parts = _DURATION_PART.findall(compact)
    if not parts or "".join(n + unit for n, unit in parts) != compact:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 10m, 2h, 14d or 1h30m)")
    return sum(int(n) * _UNIT_SECONDS[unit] for n, unit in parts)


class Duration(Rule):
    """A duration as ``--older-than`` takes it (``14d``, ``1h30m``), kept as written (lower case, blanks
    dropped); ``off``: ``0`` (or ``off``) is taken too, as 0, where it turns something off. Empty is the
    default."""

    def __init__(self, *, off: bool = False) -> None:
        self.off = off
        self.expected = "a duration such as 30s, 10m, 2h, 14d or 1h30m" + (" (0: off)" if off else " (> 0)")

    def read(self, raw: str) -> Any:
        text = raw.strip().lower()
        if not text:
            return UNSET
        if self.off and text == "off":
            return "0"
        try:
            seconds = duration_seconds(text)
        except ValueError:
            raise Invalid(raw) from None
        if seconds == 0 and not self.off:
            raise Invalid(raw)
        return text


#: the most bytes an AMQP ``user_id`` (a short string) holds: a longer name is never a message's sender
MAX_USER_NAME_BYTES = 255


class UserNames(Rule):
    """RabbitMQ user names, comma-separated, blanks around each dropped; empty (all of it) is the default.

    Refused: an empty entry (two commas in a row, a comma at either end), a name with a blank or a character
    that does not print (a control character, a zero-width one) in it, a name longer than
    :data:`MAX_USER_NAME_BYTES` bytes (no message's ``user_id`` can hold it). Such a list was mistyped: no
    RabbitMQ user of it can be what was meant."""

    expected = (
        "RabbitMQ user names, comma-separated (operator,replayer): no empty entry, no blank or unprintable "
        f"character inside a name, at most {MAX_USER_NAME_BYTES} bytes each"
    )

    def read(self, raw: str) -> Any:
        text = raw.strip()
        if not text:
            return UNSET
        names = [name.strip() for name in text.split(",")]
        for name in names:
            if not name or len(name.encode()) > MAX_USER_NAME_BYTES:
                raise Invalid(raw)
            if any(char.isspace() or not char.isprintable() for char in name):
                raise Invalid(raw)
        return ",".join(names)


@dataclass(frozen=True, slots=True)
class Env:
    """Field metadata: the variable a setting is read from, how, and the ``worker run`` option, if any.

    ``note`` follows the default in the README table (``0`` (off)). ``file``: a secret, which may also be read
    from the file that ``<var>_FILE`` names (as the official images of Postgres, RabbitMQ and Redis do).
    ``strict``: a value the rule does not take is refused instead of falling back (:func:`refused_settings`
    in worker/config/env.py): for a setting whose default is weaker than what a mistyped value meant (the
    identity settings: ``LTM_SHARD_IDENTITY=requried`` would run as ``checked``), so ``worker run`` does not
    start, ``worker check`` fails and ``worker dlq`` exits 2, as on a connection URL that can never work.
    """

    var: str
    rule: Rule
    option: str | None = None
    note: str | None = None
    file: bool = False
    strict: bool = False

    @property
    def file_var(self) -> str:
        """``LTM_POSTGRES_DSN_FILE``: the variable naming a file that holds the value."""
        return f"{self.var}_FILE"
