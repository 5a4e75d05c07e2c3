"""A small HTTP endpoint for probes and scraping: ``/healthz``, ``/readyz``, ``/metrics``.

Off unless ``LTM_HTTP_PORT`` is set; it listens on ``LTM_HTTP_HOST`` (``127.0.0.1`` unless set, so a bare
host does not expose its metrics on every interface; the container image sets ``0.0.0.0``). Plain asyncio
streams, GET only: a probe endpoint needs no web framework, and the worker stays free of one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable

import orjson

from worker.config import DEFAULT_HTTP_HOST
from worker.observability.metrics import Metrics

#: answers {dependency: None when it works, else what is wrong}
ReadinessCheck = Callable[[], Awaitable[dict[str, str | None]]]

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


class ListenError(Exception):
    """The probe endpoint could not listen on its address (port taken, address not on this host)."""


class HealthServer:
    """Serves the probes of one worker process."""

    def __init__(
        self, port: int, readiness: ReadinessCheck, metrics: Metrics, host: str = DEFAULT_HTTP_HOST
    ) -> None:
        self.port = port
        self.host = host
        self._readiness = readiness
        self._metrics = metrics
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Listen; :class:`ListenError` names the address when that is not possible."""
        try:
            self._server = await asyncio.start_server(self._serve, self.host, self.port)
        except OSError as exc:  # EADDRINUSE, EADDRNOTAVAIL, an unresolvable host name
            # asyncio's strerror repeats the address: the errno's text says it without
            errno = exc.errno or 0  # negative for a name-resolution error, whose own text is the reason
            reason = os.strerror(errno) if errno > 0 else str(exc) or type(exc).__name__
            raise ListenError(f"cannot listen on {self.host}:{self.port}: {reason}") from exc

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            method, _, rest = request.decode("latin-1").partition(" ")
            path = rest.partition(" ")[0].partition("?")[0]
            status, content_type, body = await self._answer(method, path)
            head = (
                f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + (body if method != "HEAD" else b""))
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _answer(self, method: str, path: str) -> tuple[int, str, bytes]:
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"GET only\n"
        if path == "/healthz":
            return 200, "application/json", b'{"status":"alive"}\n'
        if path == "/readyz":
            checks = await self._readiness()
            failing = {name: problem for name, problem in checks.items() if problem is not None}
            body = orjson.dumps(
                {"status": "not ready" if failing else "ready", "failing": failing, "checks": checks}
            )
            return (503 if failing else 200), "application/json", body + b"\n"
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4; charset=utf-8", self._metrics.exposition()
        return 404, "text/plain", b"try /healthz, /readyz or /metrics\n"
