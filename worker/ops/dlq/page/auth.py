"""Who may read the page: the token, the names the page answers to, and the access log's discretion.

Every request needs the token, on loopback too: else a page the operator has open in a browser can make it
read the dead letters for another site (cross-site GETs each cost a full pass over the DLQ, and a site that
rebinds its name to 127.0.0.1 reads the answers). Without ``--token``/``--token-file`` a random one is made
and printed in the URL, as Jupyter does. The token is given once (``/?token=...``, then a
``SameSite=Strict`` cookie named for the page's port, ``ltm_dlq_ui_<port>``: browsers keep cookies by host,
not by port, so every other service on ``localhost`` gets it too, and only the name keeps two pages on two
ports from overwriting each other's) or as
``Authorization: Bearer``. Before any of that, the ``Host`` header must name the address the page listens
on, ``localhost``, or a name given with ``--allow-host`` (421 otherwise): a rebound name is refused even
with a valid cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from worker.redact import describe

COOKIE = "ltm_dlq_ui"
#: the shortest token taken, and the fewest different characters it must hold
MIN_TOKEN = 16
MIN_DISTINCT = 8
#: a ``token=`` parameter, its name percent-encoded or not: what the access log never shows
_TOKEN_PARAM = re.compile(r"((?:t|%74)(?:o|%6f)(?:k|%6b)(?:e|%65)(?:n|%6e)=)[^&\s'\"]*", re.IGNORECASE)


class UiError(Exception):
    """The page cannot start: the message says why."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(token: str | None, token_file: str | None, host: str) -> tuple[str, bool]:
    """The token the page asks for, and whether it was made here (none given: only on loopback)."""
    if token_file is not None:
        try:
            token = Path(token_file).read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise UiError(f"cannot read --token-file {token_file}: {describe(exc)}") from None
    if token is None:
        if not is_loopback(host):
            raise UiError(
                f"--host {host} is not a loopback address: give a token (--token-file PATH, or --token) so "
                "only people who know it can read the dead letters"
            )
        return secrets.token_urlsafe(24), True
    problem = token_problem(token)
    if problem is not None:
        raise UiError(f"the token {problem}")
    return token, False


def token_problem(token: str) -> str | None:
    """Why ``token`` is refused (it says what to use instead), or None."""
    advice = "use a random one, e.g. `openssl rand -hex 24`"
    if len(token) < MIN_TOKEN:
        return f"must be at least {MIN_TOKEN} characters ({advice})"
    if any(char.isspace() or not char.isprintable() for char in token):
        return f"holds a blank or a control character ({advice})"
    if len(set(token)) < MIN_DISTINCT:
        return f"must hold at least {MIN_DISTINCT} different characters ({advice})"
    return None


def host_name(header: str) -> str:
    """The name a ``Host`` header gives, without its port, lower-case (``[::1]:8089`` is ``::1``)."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    name, _, port = value.rpartition(":")
    return (name if name and port.isdigit() else value).rstrip(".")


@dataclass(frozen=True, slots=True)
class Guard:
    """The token and the names the page answers to."""

    token: str
    #: the names (and addresses) a ``Host`` header may give
    names: frozenset[str]
    #: listening on every address (0.0.0.0, ::): any IP address may be the Host too (no name to rebind)
    any_address: bool
    #: the port the page listens on, in its cookie's name
    port: int = 0

    @classmethod
    def of(cls, token: str, listen: str, bound: str, allowed: Iterable[str] = (), port: int = 0) -> Guard:
        """``listen``: the ``--host`` given; ``bound``: the address the server got, on ``port``."""
        names = {"localhost", host_name(listen), host_name(bound), *(host_name(name) for name in allowed)}
        wildcard = _address(bound)
        return cls(token, frozenset(names), wildcard is not None and wildcard.is_unspecified, port)

    @property
    def cookie_name(self) -> str:
        """``ltm_dlq_ui_<port>``: one page's cookie, not another's on another port of the same host."""
        return f"{COOKIE}_{self.port}"

    def answers_to(self, header: str | None) -> bool:
        """Whether a request with this ``Host`` header is for this page (no header: no)."""
        if not header:
            return False
        name = host_name(header)
        return name in self.names or (self.any_address and _address(name) is not None)

    def session_cookie(self, session: str | None = None) -> str:
        """A session's cookie: ``SESSION.MAC``, the session a random id (a new one when None) and the MAC
        derived from the token, so the cookie does not carry the token itself."""
        session = session or secrets.token_urlsafe(12)
        return f"{session}.{self._mac('cookie', session)}"

    def is_origin(self, origin: str) -> bool:
        """Whether an ``Origin`` header is this page's: http, a name it answers to, and its port (another
        service on another port of localhost is the same *site*, so its requests carry the page's cookie,
        but it is not the same *origin*)."""
        try:
            parts = urlsplit(origin)
            port = parts.port or 80
        except ValueError:
            return False
        return parts.scheme == "http" and port == self.port and self.answers_to(parts.netloc)

    @property
    def cookie(self) -> str:
        """A cookie of a new session."""
        return self.session_cookie()

    def session_of(self, cookie: str) -> str | None:
        """The session a cookie of this page's carries, or None (not this page's, or forged)."""
        session, _, mac = cookie.partition(".")
        if not session or not hmac.compare_digest(mac.encode(), self._mac("cookie", session).encode()):
            return None
        return session

    def is_token(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self.token.encode())

    def is_cookie(self, given: str) -> bool:
        return self.session_of(given) is not None

    def csrf(self, session: str) -> str:
        """The session's form token: every POST carries it, and a page of another origin cannot read it."""
        return self._mac("csrf", session)

    def is_csrf(self, session: str, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self.csrf(session).encode())

    def _mac(self, purpose: str, session: str) -> str:
        return hmac.new(
            self.token.encode(), f"ltm-dlq-ui {purpose} {session}".encode(), hashlib.sha256
        ).hexdigest()


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def without_token(text: str) -> str:
    """``text`` (a request line, a log message) with the value of any ``token=`` parameter as ``***``."""
    return _TOKEN_PARAM.sub(r"\1***", text)
