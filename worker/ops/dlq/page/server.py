"""The page's HTTP server: ``http.server`` in a thread, one request at a time (two views at once would each
see only the letters the other does not hold), every view run on the command's event loop."""

from __future__ import annotations

import hmac
from collections.abc import Callable, Coroutine
from http import HTTPStatus
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, TextIO
from urllib.parse import parse_qs, urlencode, urlsplit

from worker.ops.dlq.audit import AuditUnavailable
from worker.ops.dlq.letters import GROUP_FIELDS, Selection
from worker.ops.dlq.page.auth import COOKIE
from worker.ops.dlq.page.markup import esc, page
from worker.ops.dlq.page.reading import Reader
from worker.ops.dlq.page.views import group_page, history_page, letter_page, overview
from worker.redact import describe

Runner = Callable[[Coroutine[Any, Any, Any]], Any]


class Handler(BaseHTTPRequestHandler):
    """GET and HEAD only; every view rendered on the command's event loop."""

    server: UiServer
    server_version = "worker-dlq-ui"
    sys_version = ""

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        if not self._authorised(parts.path, query):
            return
        try:
            status, text = self.server.view(parts.path, query)
        except Exception as exc:  # the broker or the database failed this view: say so, keep serving
            status, text = HTTPStatus.SERVICE_UNAVAILABLE, page("Unavailable", _problem(exc))
        self._send(status, text)

    def _authorised(self, path: str, query: dict[str, str]) -> bool:
        token = self.server.token
        if token is None:
            return True
        given = query.get("token")
        if given is not None and hmac.compare_digest(given.encode(), token.encode()):
            rest = {k: v for k, v in query.items() if k != "token"}
            self.send_response(HTTPStatus.SEE_OTHER)
            self.send_header("Location", path + ("?" + urlencode(rest) if rest else ""))
            self.send_header("Set-Cookie", f"{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return False
        cookie = SimpleCookie(self.headers.get("Cookie", ""))
        candidates = [cookie[COOKIE].value] if COOKIE in cookie else []
        bearer = self.headers.get("Authorization", "")
        if bearer.startswith("Bearer "):
            candidates.append(bearer[7:])
        if any(hmac.compare_digest(c.encode(), token.encode()) for c in candidates):
            return True
        self._send(
            HTTPStatus.UNAUTHORIZED,
            page(
                "Token needed",
                "<section><h2>This page needs its token</h2><p>Open it once as "
                "<code>/?token=...</code> (a cookie keeps it for the session).</p></section>",
            ),
        )
        return False

    def _send(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header(
            "Content-Security-Policy",
            "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'none'; "
            "frame-ancestors 'none'; base-uri 'none'",
        )
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        self.server.log.write(f"{self.address_string()} {format % args}\n")
        self.server.log.flush()


def _problem(exc: BaseException) -> str:
    return f"<section><h2>The page cannot be built now</h2><p>{esc(describe(exc))}</p></section>"


class UiServer(HTTPServer):
    """One request at a time (see the module's note); views run on ``run`` (the command's loop)."""

    def __init__(
        self, address: tuple[str, int], reader: Reader, run: Runner, token: str | None, log: TextIO
    ) -> None:
        super().__init__(address, Handler)
        self.reader = reader
        self.run = run
        self.token = token
        self.log = log

    def view(self, path: str, query: dict[str, str]) -> tuple[int, str]:
        reader = self.reader
        if path == "/":
            snapshot = self.run(reader.snapshot())
            return HTTPStatus.OK, overview(snapshot, self._history(10))
        if path == "/letter" and query.get("id"):
            found, scanned = self.run(reader.letter(query["id"]))
            return (HTTPStatus.OK if found else HTTPStatus.NOT_FOUND), letter_page(
                query["id"], found, scanned
            )
        if path == "/group" and query.get("by") in GROUP_FIELDS and "value" in query:
            by, value = query["by"], query["value"]
            snapshot = self.run(reader.snapshot(Selection(groups=frozenset({(by, value)}))))
            return HTTPStatus.OK, group_page(by, value, snapshot)
        if path == "/history":
            operation = query.get("operation")
            return HTTPStatus.OK, history_page(self._history(200, operation), operation)
        return HTTPStatus.NOT_FOUND, page("Not found", "<section><h2>Nothing here</h2></section>")

    def _history(self, limit: int, operation: str | None = None) -> list[dict[str, Any]] | str:
        try:
            return self.run(self.reader.history(limit, operation))  # type: ignore[no-any-return]
        except (AuditUnavailable, ValueError) as exc:
            return str(exc)
        except Exception as exc:
            return describe(exc)
