"""Cache invalidation over Redis pub/sub, published after the event's write committed."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from typing import Any

import orjson
import redis.asyncio as aioredis
import redis.exceptions


class InvalidationPublisher:
    """Publishes invalidation messages on the shards' channel.

    Concurrent events share round trips: whatever is waiting when the flusher runs goes out as one
    pipeline, so under load one write carries many PUBLISHes (each event still waits for its own).
    Redis pub/sub is at-most-once to each subscriber; a short in-place retry rides over a blip, and a
    longer outage surfaces to every waiting event as an error, which the outbox
    (:mod:`worker.invalidation.outbox`) turns into a pending mark in Postgres, published once Redis answers.
    """

    def __init__(self, url: str, channel: str, *, tries: int = 3, pause: float = 0.2) -> None:
        self._client: aioredis.Redis = aioredis.Redis.from_url(
            url, socket_connect_timeout=2, socket_timeout=2, health_check_interval=10
        )
        self._channel = channel
        self._tries = tries
        self._pause = pause
        self._waiting: list[tuple[bytes, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def publish(self, invalidation: dict[str, Any]) -> None:
        """Publish one invalidation; returns once Redis accepted it (raises when it would not)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((orjson.dumps(invalidation), done))
        if self._flusher is None or self._flusher.done():
            # the flusher serves every waiting event, not the one that started it: an empty context, so it
            # carries no event's log fields or span
            self._flusher = asyncio.create_task(self._flush(), context=contextvars.Context())
        await done

    async def _flush(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                await self._send([payload for payload, _ in batch])
            except Exception as exc:
                for _, done in batch:
                    if not done.done():
                        done.set_exception(exc)
            else:
                for _, done in batch:
                    if not done.done():
                        done.set_result(None)

    async def _send(self, payloads: list[bytes]) -> None:
        for attempt in range(1, self._tries + 1):
            try:
                if len(payloads) == 1:
                    await self._client.publish(self._channel, payloads[0])
                else:
                    pipe = self._client.pipeline(transaction=False)
                    for payload in payloads:
                        pipe.publish(self._channel, payload)
                    await pipe.execute()
                return
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                if attempt == self._tries:
                    raise
                await asyncio.sleep(self._pause * attempt)

    async def publish_all(self, invalidations: list[Any]) -> None:
        """Publish several invalidations in one pipelined round trip (raises when Redis would not)."""
        if invalidations:
            await self._send([orjson.dumps(invalidation) for invalidation in invalidations])

    async def ping(self) -> bool:
        return bool(await self._client.ping())

    async def close(self) -> None:
        if self._flusher is not None and not self._flusher.done():
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        await self._client.aclose()
