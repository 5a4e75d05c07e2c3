"""``InvalidationSubscriber``: the cache invalidations of CONTRACT.md section 6 (Redis pub/sub), by kind.

The Python counterpart of the TypeScript kit's subscriber: it subscribes to ``tomori:cache-invalidation`` and
hands each message, parsed (:class:`contracts.models.ServerStateInvalidation` or
:class:`~contracts.models.UserInvalidation`), to ``on_server_state`` or ``on_user``. Pub/sub keeps no
history: when the connection was lost, invalidations sent meanwhile are gone, so once the subscription is
back ``on_resubscribed`` runs (drop every cache the subscriber guards). A shard's Redis user needs only
SUBSCRIBE and PING (deploy/redis/users.acl).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Self

import redis.asyncio as aioredis
import redis.exceptions
from pydantic import TypeAdapter, ValidationError

from contracts.models import CacheInvalidation, ServerStateInvalidation, UserInvalidation, invalidation_id
from contracts.names import INVALIDATION_CHANNEL
from contracts.shard.errors import LtmClientError

__all__ = ["INVALIDATION_CHANNEL", "InvalidationSubscriber", "invalidation_id_of"]

log = logging.getLogger("contracts.shard")

_INVALIDATION: TypeAdapter[ServerStateInvalidation | UserInvalidation] = TypeAdapter(CacheInvalidation)
_LOST = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError, TimeoutError)

OnServerState = Callable[[ServerStateInvalidation], Awaitable[None] | None]
OnUser = Callable[[UserInvalidation], Awaitable[None] | None]
OnResubscribed = Callable[[], Awaitable[None] | None]


def invalidation_id_of(event_id: str | uuid.UUID) -> str:
    """The ``invalidation_id`` the worker puts on the invalidations of your save of ``event_id`` (an
    invalidation never carries the event id itself; this recognises your own)."""
    return invalidation_id(event_id if isinstance(event_id, uuid.UUID) else uuid.UUID(event_id))


class InvalidationSubscriber:
    """Listens to ``tomori:cache-invalidation`` and dispatches by ``kind``: :meth:`start`, :meth:`close`."""

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        on_server_state: OnServerState | None,
        on_user: OnUser | None,
        on_resubscribed: OnResubscribed | None,
        max_reconnect_delay: float,
    ) -> None:
        self._client = client
        self._pubsub: Any = client.pubsub()
        self.on_server_state = on_server_state
        self.on_user = on_user
        self.on_resubscribed = on_resubscribed
        self.max_reconnect_delay = max_reconnect_delay
        self._subscriptions = 0
        self._listener: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    async def start(
        cls,
        url: str,
        *,
        on_server_state: OnServerState | None = None,
        on_user: OnUser | None = None,
        on_resubscribed: OnResubscribed | None = None,
        max_reconnect_delay: float = 5.0,
    ) -> InvalidationSubscriber:
        """Connect and subscribe; returns once Redis confirmed the subscription. Raises
        :class:`~contracts.shard.errors.LtmClientError` when the first connection fails (a wrong password, a
        user that may not subscribe), leaving nothing running; after that it reconnects by itself."""
        client = aioredis.Redis.from_url(url, socket_connect_timeout=5, health_check_interval=30)
        subscriber = cls(
            client,
            on_server_state=on_server_state,
            on_user=on_user,
            on_resubscribed=on_resubscribed,
            max_reconnect_delay=max_reconnect_delay,
        )
        try:
            await subscriber._pubsub.subscribe(INVALIDATION_CHANNEL)
            while subscriber._subscriptions == 0:
                message = await subscriber._pubsub.get_message(timeout=5.0)
                if message is None:
                    raise LtmClientError(f"Redis did not confirm the subscription to {INVALIDATION_CHANNEL}")
                await subscriber._handle(message)
        except Exception as error:
            await subscriber._shut()
            if isinstance(error, LtmClientError):
                raise
            raise LtmClientError(f"cannot subscribe to {INVALIDATION_CHANNEL}: {error}") from error
        subscriber._listener = asyncio.create_task(subscriber._listen(), name="ltm-invalidations")
        return subscriber

    @property
    def subscription_count(self) -> int:
        """How many times the subscription was made (1 + reconnections)."""
        return self._subscriptions

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
        await self._shut()

    async def _shut(self) -> None:
        self._closed = True
        with contextlib.suppress(Exception):
            await self._pubsub.aclose()
        with contextlib.suppress(Exception):
            await self._client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _listen(self) -> None:
        delay = 0.1
        connected = True
        while not self._closed:
            try:
                # after a lost connection redis-py connects again here and subscribes again (a "subscribe"
                # confirmation follows, which counts the resubscription)
                message = await self._pubsub.get_message(timeout=1.0)
            except _LOST as error:
                if connected:
                    log.warning(
                        "redis connection lost; invalidations are missed until it is back (%s)", error
                    )
                    connected = False
                await asyncio.sleep(delay * (0.5 + random.random() / 2))
                delay = min(delay * 2, self.max_reconnect_delay)
                continue
            if message is None:
                continue
            connected, delay = True, 0.1
            await self._handle(message)

    async def _handle(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "subscribe":
            self._subscriptions += 1
            if self._subscriptions > 1:
                log.info("resubscribed to the invalidation channel; caches must be dropped")
                await self._guard("on_resubscribed", self.on_resubscribed)
            return
        if kind != "message":
            return
        try:
            parsed = _INVALIDATION.validate_json(message["data"])
        except ValidationError:
            log.warning("dropped an invalidation that is not the contract's (unknown kind, or not JSON)")
            return
        if isinstance(parsed, ServerStateInvalidation):
            await self._guard("on_server_state", self.on_server_state, parsed)
        else:
            await self._guard("on_user", self.on_user, parsed)

    async def _guard(
        self, name: str, callback: Callable[..., Awaitable[None] | None] | None, *args: Any
    ) -> None:
        if callback is None:
            return
        try:
            value = callback(*args)
            if value is not None:
                await value
        except Exception:
            log.exception("%s failed", name)
