"""What the worker shows of a failure: a URL's password hidden, an exception on one line.

Every output goes through here: logs, ``worker check``, the operator commands, dead-letter headers and error
messages quote connection URLs through :func:`redact_url` and exceptions through :func:`describe`.
"""

from __future__ import annotations

import re
import ssl

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


#: a connection setting that is a URL (or a list of them) begins with its scheme
_URL_FORM = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*://")


def redact_setting(value: str) -> str:
    """A connection setting as outputs show it (``worker check``, ``run``'s ``starting`` line, ``migrate``'s
    errors): its URL(s) through :func:`redact_url`; or, when it does not begin as a URL (``amqp//u:p@h``,
    ``u:p@h``, a password alone, the first line of the wrong file), ``<unreadable, N characters>``: without
    a scheme, nothing says where its password ends, so none of it is shown."""
    if _URL_FORM.match(value):
        return redact_url(value)
    return f"<unreadable, {len(value)} characters>"


def _redact_userinfo(rest: str) -> str:
    """What follows ``scheme://``, the password of its userinfo hidden (nothing to hide without one)."""
    at = rest.rfind("@")
    if at < 0:
        return rest
    user, colon, _ = rest[:at].partition(":")
    return f"{user}:***{rest[at:]}" if colon else rest


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what caused it, each once (aiormq's chains loop)."""
    found: list[BaseException] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


#: how :func:`describe` begins for a TLS certificate the client did not accept
CERTIFICATE_REFUSED = "TLS certificate not accepted"


def certificate_failure(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The TLS verification failure behind ``exc`` (the server's certificate is not signed by the CA the
    URL names, has expired, or is not for the host connected to), else None.

    asyncpg raises it as it is (it is also a ``ValueError``, which must not pass for a malformed
    connection string), aio-pika and redis-py wrap it in their connection errors."""
    for current in _chain(exc):
        if isinstance(current, ssl.SSLCertVerificationError):
            return current
    return None


def describe(exc: BaseException) -> str:
    """``Type: message`` on one line (at most 500 characters), for logs, dead-letter headers and the operator
    commands; a password the message quotes (a URL, a ``password=`` parameter) is redacted, and a TLS
    certificate the client refused says so first (``TLS certificate not accepted (...): ...``)."""
    text = " ".join(redact_url(str(exc)).split()) or "(no message)"
    line = f"{type(exc).__name__}: {text}"
    refused = certificate_failure(exc)
    if refused is not None:
        reason = refused.verify_message or "verification failed"
        if refused is not exc and refused.strerror and refused.strerror not in text:
            line += f" ({' '.join(refused.strerror.split())})"
        line = f"{CERTIFICATE_REFUSED} ({reason}): {line}"
    return line[:500]


def message_of(exc: BaseException) -> str:
    """:func:`describe`'s line without the type (``Connection refused``), or the type's name when the message
    is empty: for a sentence that already says what failed."""
    return describe(exc).partition(": ")[2] or type(exc).__name__
