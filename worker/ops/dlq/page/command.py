"""``worker dlq ui``: start the page's server, print where it is, serve until Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TextIO
from urllib.parse import urlencode

from worker.config import Topology
from worker.ops.dlq.page.auth import Guard, UiError, read_token
from worker.ops.dlq.page.reading import Reader
from worker.ops.dlq.page.server import UiServer
from worker.ops.dlq.sweep import DEFAULT_BATCH
from worker.redact import describe

#: how long one view may take (a pass over the queue, the audit query) before the page says so
VIEW_TIMEOUT = 120.0


async def ui_command(
    url: str,
    dsn: str,
    topology: Topology,
    *,
    host: str = "127.0.0.1",
    port: int = 8089,
    token: str | None = None,
    token_file: str | None = None,
    allow_hosts: Sequence[str] = (),
    batch: int = DEFAULT_BATCH,
    out: TextIO | None = None,
    trusted: frozenset[str] = frozenset(),
    actor: str = "the page",
) -> int:
    """Serve the page until interrupted. Exit 2 when it cannot start (no token off loopback, a token too
    weak, the port). ``trusted``: LTM_TRUSTED_PUBLISHERS, by which a letter's "published by" is read;
    ``actor``: who the buttons' replays and purges are recorded as (``--by``)."""
    out = out or sys.stdout
    try:
        secret, made_here = read_token(token, token_file, host)
    except UiError as exc:
        print(f"worker dlq ui: {exc}", file=sys.stderr)
        return 2
    loop = asyncio.get_running_loop()

    def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(asyncio.wait_for(coroutine, VIEW_TIMEOUT), loop).result()

    try:
        reader = Reader(url, dsn, topology, batch, trusted)
        server = UiServer((host, port), reader, run, sys.stderr, actor)
    except OSError as exc:
        print(f"worker dlq ui: cannot listen on {host}:{port}: {describe(exc)}", file=sys.stderr)
        return 2
    bound_host, bound_port = str(server.server_address[0]), int(server.server_address[1])
    server.guard_with(Guard.of(secret, host, bound_host, allow_hosts, bound_port))
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    address = f"http://{shown}:{bound_port}/"
    if made_here:  # the URL is the way in: it carries the token once, then a cookie does
        out.write(f"serving the dead-letter page on {address}?{urlencode({'token': secret})} (")
    else:
        out.write(f"serving the dead-letter page on {address} (open it once as /?token=TOKEN; ")
    out.write(f"its buttons act as {actor}; Ctrl-C stops it)\n")
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
