"""Cache invalidation over Redis pub/sub, published after the event's transaction commits."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import redis.asyncio as aioredis
import redis.exceptions


class InvalidationPublisher:
    """Publishes invalidation messages on the shards' channel.

    Redis pub/sub is at-most-once to each subscriber; a short in-place retry rides over a blip, and a
    longer outage surfaces as a transient error so the event goes round the retry queues (its result
    is then re-emitted from the store with the invalidation).
    """

    def __init__(self, url: str, channel: str, *, tries: int = 3, pause: float = 0.2) -> None:
        self._client: aioredis.Redis = aioredis.Redis.from_url(
            url, socket_connect_timeout=2, socket_timeout=2, health_check_interval=10
        )
        self._channel = channel
        self._tries = tries
        self._pause = pause

    async def publish(self, invalidation: dict[str, Any]) -> None:
        payload = orjson.dumps(invalidation)
        for attempt in range(1, self._tries + 1):
            try:
                await self._client.publish(self._channel, payload)
                return
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                if attempt == self._tries:
                    raise
                await asyncio.sleep(self._pause * attempt)

    async def ping(self) -> bool:
        return bool(await self._client.ping())

    async def close(self) -> None:
        await self._client.aclose()
