"""The page's HTTP server: ``http.server`` with a thread per connection, at most :data:`MAX_CONNECTIONS` at
once, and one view at a time (two views at once would each see only the letters the other does not hold),
every view run on the command's event loop.

A connection must send its request line and headers within :data:`HEAD_DEADLINE` seconds, and may be silent
for at most :data:`IDLE_TIMEOUT` seconds at any point: a client that connects and says nothing (or trickles
its headers) is cut off, and while it waits the other connections are served. At the cap, a newcomer takes
the place of the oldest connection still waiting for its head: connections that say nothing cannot keep the
operator out (a browser sends its request at once), only requests being served can fill the page. The
``Host`` check and the token come before a view, so a request without them never waits for one, and never
costs a pass over the DLQ. The access log never shows a token.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TextIO
from urllib.parse import parse_qs, urlencode, urlsplit

from worker.broker.dead_letters import Letter
from worker.ops.dlq.audit import AuditUnavailable
from worker.ops.dlq.history import Record
from worker.ops.dlq.page.auth import Guard, host_name, without_token
from worker.ops.dlq.page.buttons import (
    MAX_FORM_BYTES,
    Asked,
    Launcher,
    Refused,
    confirm_page,
    hopeless,
    operations_page,
)
from worker.ops.dlq.page.markup import esc, page
from worker.ops.dlq.page.reading import Reader
from worker.ops.dlq.page.views import group_page, history_page, letter_page, overview
from worker.ops.dlq.render import terminal_safe
from worker.ops.dlq.selection import GROUP_FIELDS, Selection
from worker.redact import describe

#: connections served at once; one more is answered 503 and closed
MAX_CONNECTIONS = 8
#: seconds a connection has to send its request line and headers
HEAD_DEADLINE = 10.0
#: seconds a connection may be silent while the server waits for it (or it for the server's answer)
IDLE_TIMEOUT = 10.0

Runner = Callable[[Coroutine[Any, Any, Any]], Any]
#: the session of a request that gave the token as ``Authorization: Bearer`` (no cookie)
BEARER = "bearer"

_BUSY = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n"
    b"Retry-After: 2\r\n\r\nThe dead-letter page is serving as many connections as it takes; try again.\n"
)


class Handler(BaseHTTPRequestHandler):
    """GET and HEAD only; every view rendered on the command's event loop."""

    server: UiServer
    server_version = "worker-dlq-ui"
    sys_version = ""
    timeout = IDLE_TIMEOUT

    def setup(self) -> None:
        super().setup()
        self.server.watch(self)

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        self.server.unwatch(self)  # the request line and headers are in (or refused)
        return parsed

    def finish(self) -> None:
        self.server.unwatch(self)
        super().finish()

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        if not self._for_this_page() or (session := self._authorised(parts.path, query)) is None:
            return
        try:
            status, text = self.server.view(parts.path, query, session)
        except Exception as exc:  # the broker or the database failed this view: say so, keep serving
            status, text = HTTPStatus.SERVICE_UNAVAILABLE, page("Unavailable", _problem(exc))
        self._send(status, text)

    def do_POST(self) -> None:
        """A button's form (buttons.py): this page's Host, its session, a request of its own origin, and the
        session's form token, before anything is read or done."""
        parts = urlsplit(self.path)
        if not self._for_this_page() or (session := self._authorised(parts.path, {})) is None:
            return
        origin = self.headers.get("Origin")  # a browser sends it with every POST; "null" is no origin
        if origin is not None and not self.server.guard.is_origin(origin):
            self._send(HTTPStatus.FORBIDDEN, page("Refused", _refusal("a form of another site's")))
            return
        length = self.headers.get("Content-Length", "")
        if parts.path != "/act" or not length.isdigit() or int(length) > MAX_FORM_BYTES:
            self._send(HTTPStatus.BAD_REQUEST, page("Refused", _refusal("not a form of this page's")))
            return
        form = {
            k: v[-1] for k, v in parse_qs(self.rfile.read(int(length)).decode("utf-8", "replace")).items()
        }
        if not self.server.guard.is_csrf(session, form.get("csrf", "")):
            self._send(HTTPStatus.FORBIDDEN, page("Refused", _refusal("a form without this session's token")))
            return
        try:
            status, text = self.server.act(form, session)
        except Exception as exc:
            status, text = HTTPStatus.SERVICE_UNAVAILABLE, page("Unavailable", _problem(exc))
        if status == HTTPStatus.SEE_OTHER:
            self.send_response(HTTPStatus.SEE_OTHER)
            self.send_header("Location", text)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._send(status, text)

    def _for_this_page(self) -> bool:
        """The ``Host`` header names this page (a name rebound to this address does not)."""
        host = self.headers.get("Host")
        if self.server.guard.answers_to(host):
            return True
        asked = host_name(host) if host else "no Host header"
        names = ", ".join(sorted(self.server.guard.names))
        self._send(
            HTTPStatus.MISDIRECTED_REQUEST,
            page(
                "Not this page's name",
                f"<section><h2>This page answers to {esc(names)}, not {esc(asked)}</h2><p>If that is how you "
                "reach it (a proxy, a tunnel), start it with <code>--allow-host NAME</code>.</p></section>",
            ),
        )
        return False

    def _authorised(self, path: str, query: dict[str, str]) -> str | None:
        """The request's session (its cookie's, or ``bearer``), or None once it was answered (a token given
        in the URL: a new session's cookie and a redirect; none: 401)."""
        guard = self.server.guard
        given = query.get("token")
        if given is not None and guard.is_token(given):
            rest = {k: v for k, v in query.items() if k != "token"}
            self.send_response(HTTPStatus.SEE_OTHER)
            self.send_header("Location", path + ("?" + urlencode(rest) if rest else ""))
            self.send_header(
                "Set-Cookie", f"{guard.cookie_name}={guard.cookie}; HttpOnly; SameSite=Strict; Path=/"
            )
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        try:
            cookie = SimpleCookie(self.headers.get("Cookie", ""))
        except CookieError:
            cookie = SimpleCookie()
        name = guard.cookie_name
        if name in cookie and (session := guard.session_of(cookie[name].value)) is not None:
            return session
        bearer = self.headers.get("Authorization", "")
        if bearer.startswith("Bearer ") and guard.is_token(bearer[7:]):
            return BEARER
        self._send(
            HTTPStatus.UNAUTHORIZED,
            page(
                "Token needed",
                "<section><h2>This page needs its token</h2><p>Open it once as "
                "<code>/?token=...</code>, the URL <code>worker dlq ui</code> printed (a cookie keeps it "
                "for the session), or send <code>Authorization: Bearer ...</code>.</p></section>",
            ),
        )
        return None

    def _send(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header(
            "Content-Security-Policy",
            "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; "
            "frame-ancestors 'none'; base-uri 'none'",
        )
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """One line per request or error: the token never shown, control characters escaped."""
        line = terminal_safe(without_token(f"{self.address_string()} {format % args}"))
        self.server.log.write(line + "\n")
        self.server.log.flush()


def _refusal(why: str) -> str:
    return (
        f"<section><h2>Refused: {esc(why)}</h2><p>Nothing was done. Start again from the page.</p></section>"
    )


def _problem(exc: BaseException) -> str:
    return f"<section><h2>The page cannot be built now</h2><p>{esc(describe(exc))}</p></section>"


class UiServer(ThreadingHTTPServer):
    """A thread per connection up to :data:`MAX_CONNECTIONS`; views one at a time on ``run`` (the command's
    loop); connections slow to say what they want cut off by :meth:`service_actions`."""

    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], reader: Reader, run: Runner, log: TextIO, actor: str = "the page"
    ) -> None:
        super().__init__(address, Handler)
        self.reader = reader
        #: what runs the buttons' operations, as ``actor`` (``--by``)
        self.launcher = Launcher(reader.url, reader.dsn, actor, [])
        self.run = run
        self.log = log
        #: set once the address is bound (:meth:`guard_with`)
        self.guard = Guard("", frozenset(), False)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._one_view = threading.Lock()
        self._heads: dict[Handler, float] = {}
        #: connections cut off to make room for a newcomer, whose slot went to it
        self._cut: set[Handler] = set()
        self._heads_lock = threading.Lock()

    def guard_with(self, guard: Guard) -> None:
        self.guard = guard

    # --- connections -------------------------------------------------------------------------------------

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False) and not self._make_room():
            with contextlib.suppress(OSError):
                request.sendall(_BUSY)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def _make_room(self) -> bool:
        """Cut off the oldest connection still waiting for its head, and take its place (its thread ends at
        once and gives its slot back then: one thread more meanwhile). False when every connection is being
        served."""
        with self._heads_lock:
            if not self._heads:
                return False
            oldest = min(self._heads, key=self._heads.__getitem__)
            del self._heads[oldest]
            self._cut.add(oldest)
        with contextlib.suppress(OSError):  # its read returns at once: it ends
            oldest.connection.shutdown(socket.SHUT_RDWR)
        return True

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots_release(request)

    def _slots_release(self, request: Any) -> None:
        """A connection that was cut to make room gave its slot to the newcomer already."""
        with self._heads_lock:
            cut = next((h for h in self._cut if h.request is request), None)
            if cut is not None:
                self._cut.discard(cut)
                return
        self._slots.release()

    def watch(self, handler: Handler) -> None:
        with self._heads_lock:
            self._heads[handler] = time.monotonic() + HEAD_DEADLINE

    def unwatch(self, handler: Handler) -> None:
        with self._heads_lock:
            self._heads.pop(handler, None)

    def service_actions(self) -> None:
        """Between polls (every half second): cut off connections past their deadline for the head."""
        now = time.monotonic()
        with self._heads_lock:
            late = [handler for handler, deadline in self._heads.items() if deadline < now]
            for handler in late:
                del self._heads[handler]
        for handler in late:
            with contextlib.suppress(OSError):  # its read returns at once: it ends
                handler.connection.shutdown(socket.SHUT_RDWR)

    # --- views ---------------------------------------------------------------------------------------------

    def view(self, path: str, query: dict[str, str], session: str = BEARER) -> tuple[int, str]:
        with self._one_view:
            return self._view(path, query, self.guard.csrf(session))

    def act(self, form: dict[str, str], session: str) -> tuple[int, str]:
        """What a button's form asks for, its token checked: a replay or purge started (its own process) or
        a cancel asked, then the operations view (303); or why not."""
        with self._one_view:
            try:
                asked = Asked.of(form)
            except Refused as exc:
                return HTTPStatus.BAD_REQUEST, page("Refused", _refusal(str(exc)))
            if asked.operation is not None:
                try:
                    found = self.run(self.reader.cancel(asked.operation, self.launcher.actor))
                except ValueError:
                    found = None
                if found is None:
                    return HTTPStatus.NOT_FOUND, page("Refused", _refusal("no such operation"))
                return HTTPStatus.SEE_OTHER, "/operations"
            letters = self.run(self.reader.snapshot(asked.selection())).letters
            csrf = self.guard.csrf(session)
            if not letters:
                return HTTPStatus.CONFLICT, confirm_page(asked, letters, csrf)
            if asked.action == "replay" and hopeless(letters) and not asked.again:
                why = "some of these letters will fail again: tick the box to replay them all the same"
                return HTTPStatus.CONFLICT, confirm_page(asked, letters, csrf, refused=why)
            self.launcher.launch(asked)
            return HTTPStatus.SEE_OTHER, "/operations"

    def _view(self, path: str, query: dict[str, str], csrf: str) -> tuple[int, str]:
        reader = self.reader
        if path == "/confirm":
            try:
                asked = Asked.of(query)
            except Refused as exc:
                return HTTPStatus.BAD_REQUEST, page("Refused", _refusal(str(exc)))
            if asked.operation is not None:
                return HTTPStatus.BAD_REQUEST, page("Refused", _refusal("cancel from the operations view"))
            return HTTPStatus.OK, confirm_page(
                asked, self.run(reader.snapshot(asked.selection())).letters, csrf
            )
        if path == "/operations":
            self.launcher.reap()
            return HTTPStatus.OK, operations_page(self.run(reader.operations()), csrf)
        if path == "/":
            snapshot = self.run(reader.snapshot())
            return HTTPStatus.OK, overview(snapshot, self._history(10, letters=snapshot.letters))
        if path == "/letter" and query.get("id"):
            found, scanned = self.run(reader.letter(query["id"]))
            return (HTTPStatus.OK if found else HTTPStatus.NOT_FOUND), letter_page(
                query["id"], found, scanned, self._life(query["id"])
            )
        if path == "/group" and query.get("by") in GROUP_FIELDS and "value" in query:
            by, value = query["by"], query["value"]
            snapshot = self.run(reader.snapshot(Selection(groups=frozenset({(by, value)}))))
            return HTTPStatus.OK, group_page(by, value, snapshot)
        if path == "/history":
            operation = query.get("operation")
            return HTTPStatus.OK, history_page(self._history(200, operation), operation)
        return HTTPStatus.NOT_FOUND, page("Not found", "<section><h2>Nothing here</h2></section>")

    def _life(self, event_id: str) -> list[dict[str, Any]] | str:
        try:
            return self.run(self.reader.life(event_id))  # type: ignore[no-any-return]
        except AuditUnavailable as exc:
            return str(exc)
        except Exception as exc:
            return describe(exc)

    def _history(
        self, limit: int, operation: str | None = None, letters: list[Letter] | None = None
    ) -> Record | str:
        try:
            return self.run(self.reader.history(limit, operation, letters))  # type: ignore[no-any-return]
        except (AuditUnavailable, ValueError) as exc:
            return str(exc)
        except Exception as exc:
            return describe(exc)
