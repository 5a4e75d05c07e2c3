"""A TCP proxy the test can cut and restore: a dependency outage for one worker, without touching the
shared service other tests use."""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit, urlunsplit


class CuttableProxy:
    """Forwards 127.0.0.1:<port> to ``target``; :meth:`cut` drops every connection and refuses new ones."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> CuttableProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def url(self, original: str) -> str:
        """``original`` (a DSN or URL) pointed at this proxy instead of its own host and port."""
        parts = urlsplit(original)
        auth = parts.netloc.rpartition("@")[0]
        netloc = f"{auth}@127.0.0.1:{self.port}" if auth else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    async def cut(self) -> None:
        """Refuse new connections and reset the open ones, as a dead host would."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._writers.clear()

    async def restore(self) -> None:
        if self._server is None:
            await self.start()

    async def close(self) -> None:
        await self.cut()
        for task in list(self._pipes):
            task.cancel()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, upstream_writer))
        for source, sink in ((reader, upstream_writer), (upstream_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._writers.discard(sink)
            with contextlib.suppress(Exception):
                sink.close()
