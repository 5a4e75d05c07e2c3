"""``worker dlq ui``: a read-only page over the DLQ and the audit record.

Standard library only. ``reading`` makes a view's pass over the queue the way ``list`` makes it (each message
held unacked only while the page is built, then put back in order) and reads the audit history; ``views``
(with ``markup`` and ``charts``) builds the HTML; ``auth`` is the token; ``server`` the HTTP server, in a
thread, calling back into the command's event loop. Nothing here acks a message: the page never replays or
deletes.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Coroutine
from typing import Any, TextIO

from worker.config import Topology
from worker.ops.dlq.page.auth import UiError, read_token
from worker.ops.dlq.page.reading import Reader
from worker.ops.dlq.page.server import UiServer
from worker.ops.dlq.sweep import DEFAULT_BATCH
from worker.redact import describe

#: how long one view may take (a pass over the queue, the audit query) before the page says so
VIEW_TIMEOUT = 120.0

__all__ = ["ui_command"]


async def ui_command(
    url: str,
    dsn: str,
    topology: Topology,
    *,
    host: str = "127.0.0.1",
    port: int = 8089,
    token: str | None = None,
    token_file: str | None = None,
    batch: int = DEFAULT_BATCH,
    out: TextIO | None = None,
) -> int:
    """Serve the page until interrupted. Exit 2 when it cannot start (no token off loopback, the port)."""
    out = out or sys.stdout
    try:
        secret = read_token(token, token_file, host)
    except UiError as exc:
        print(f"worker dlq ui: {exc}", file=sys.stderr)
        return 2
    loop = asyncio.get_running_loop()

    def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(asyncio.wait_for(coroutine, VIEW_TIMEOUT), loop).result()

    try:
        server = UiServer((host, port), Reader(url, dsn, topology, batch), run, secret, sys.stderr)
    except OSError as exc:
        print(f"worker dlq ui: cannot listen on {host}:{port}: {describe(exc)}", file=sys.stderr)
        return 2
    bound_host, bound_port = str(server.server_address[0]), int(server.server_address[1])
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    out.write(f"serving the dead-letter page on http://{shown}:{bound_port}/ (read-only; Ctrl-C stops it)\n")
    out.flush()
    thread = threading.Thread(target=server.serve_forever, name="dlq-ui", daemon=True)
    thread.start()
    try:
        await asyncio.to_thread(thread.join)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(server.shutdown)
        server.server_close()
    return 0
