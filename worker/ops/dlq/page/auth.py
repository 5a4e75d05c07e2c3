"""Who may read the page: the token (from a file or the command line), checked by cookie, bearer or once
in the URL."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from worker.redact import describe

COOKIE = "ltm_dlq_ui"


class UiError(Exception):
    """The page cannot start: the message says why."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(token: str | None, token_file: str | None, host: str) -> str | None:
    if token_file is not None:
        try:
            token = Path(token_file).read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise UiError(f"cannot read --token-file {token_file}: {describe(exc)}") from None
    if token is not None and len(token) < 16:
        raise UiError("the token must be at least 16 characters")
    if token is None and not is_loopback(host):
        raise UiError(
            f"--host {host} is not a loopback address: give a token (--token-file PATH, or --token) so only "
            "people who know it can read the dead letters"
        )
    return token
