"""A bot shard's AMQP side, as contracts/CONTRACT.md has it and the shard's own user ``shard-<N>`` may.

It checks the exchanges (passive: shard users may not declare them), declares and binds its two durable queues
``tomori.shard.<id>.results`` and ``.notifications`` with ``shard.<id>``, consumes them on a channel of
their own, and publishes tool-call events persistent, confirmed, on a confirm-mode channel. What it does
with what comes back is its owner's: the e2e harness records every message (tests/support/harness.py), the
bench counts answers and latencies for many shards (bench/shards.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aio_pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
)

from contracts.models import ShardQueueKind, shard_queue
from worker.broker.publisher import json_properties

TOOL_CALLS_EXCHANGE = "tomori.tool_calls"
RESULTS_EXCHANGE = "tomori.tool_results"
NOTIFICATIONS_EXCHANGE = "tomori.notifications"
TOOL_ROUTING_KEY = "tool.create_long_term_memory"
EVENT_TYPE = "tool_call.v1"
CONNECT_TIMEOUT = 10.0
CLOSE_TIMEOUT = 10.0

OnMessage = Callable[[AbstractIncomingMessage], Awaitable[None]]


class ShardLink:
    """One shard's connection, its publishing and consuming channels, and its two queues.

    ``robust`` reconnects (aio-pika's robust connection) when the broker goes away and comes back, as the
    e2e tests that restart RabbitMQ need; the bench uses a plain connection, whose loss voids the run.
    ``user_id`` goes on every event as its AMQP ``user_id`` (the RabbitMQ user of ``url``, as a shard with a
    user of its own sets it, CONTRACT.md section 2); None sends none, as contract version 1 allows.
    """

    def __init__(self, url: str, shard_id: int, *, robust: bool = False, user_id: str | None = None) -> None:
        self.url = url
        self.shard_id = shard_id
        self.robust = robust
        self.user_id = user_id
        self.connection: AbstractConnection | None = None
        self.publishing: AbstractChannel | None = None
        self.consuming: AbstractChannel | None = None
        self.queues: list[AbstractQueue] = []
        self._exchanges: dict[str, AbstractExchange] = {}

    @property
    def routing_key(self) -> str:
        """The key the worker routes this shard's results and notices with."""
        return f"shard.{self.shard_id}"

    async def open(
        self,
        on_result: OnMessage,
        on_notice: OnMessage,
        *,
        no_ack: bool,
        declare_exchanges: bool = False,
        results_exchange: str = RESULTS_EXCHANGE,
        notifications_exchange: str = NOTIFICATIONS_EXCHANGE,
        tool_calls_exchange: str = TOOL_CALLS_EXCHANGE,
    ) -> None:
        """Connect, check the exchanges, declare and bind the two queues, and consume them.

        ``no_ack``: the broker forgets a message once sent (fast); otherwise the callback acks it.
        ``declare_exchanges`` first declares the three exchanges on a channel of its own, standing in for
        the definitions file a production broker loads (a test may open its shard before any worker ran).
        """
        connect = aio_pika.connect_robust if self.robust else aio_pika.connect
        self.connection = connection = await connect(self.url, timeout=CONNECT_TIMEOUT)
        if declare_exchanges:
            setup = await connection.channel()
            for name in (tool_calls_exchange, results_exchange, notifications_exchange):
                await setup.declare_exchange(name, aio_pika.ExchangeType.TOPIC, durable=True)
            await setup.close()
        self.publishing = await connection.channel(publisher_confirms=True)
        self.consuming = consuming = await connection.channel(publisher_confirms=False)
        queues: tuple[tuple[str, ShardQueueKind, OnMessage], ...] = (
            (results_exchange, "results", on_result),
            (notifications_exchange, "notifications", on_notice),
        )
        for exchange_name, kind, callback in queues:
            exchange = await consuming.get_exchange(exchange_name)  # passive: checkExchange
            queue = await consuming.declare_queue(shard_queue(self.shard_id, kind), durable=True)
            await queue.bind(exchange, self.routing_key)
            await queue.consume(callback, no_ack=no_ack)
            self.queues.append(queue)
        self._exchanges[tool_calls_exchange] = await self.publishing.get_exchange(tool_calls_exchange)

    async def exchange(self, name: str) -> AbstractExchange:
        """The exchange ``name`` on the publishing channel (checked once when it is the tool-call one)."""
        if name not in self._exchanges:
            assert self.publishing is not None, "the shard is not open"
            self._exchanges[name] = await self.publishing.get_exchange(name, ensure=False)
        return self._exchanges[name]

    async def publish(
        self,
        body: bytes,
        *,
        routing_key: str = TOOL_ROUTING_KEY,
        exchange: str = TOOL_CALLS_EXCHANGE,
        message_id: str | None = None,
        correlation_id: str | None = None,
        type: str | None = None,
        headers: Mapping[str, Any] | None = None,
        mandatory: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Publish like the bot: persistent JSON, confirmed by the broker (an exception when it is not).

        Straight to aiormq's channel with the properties an aio-pika ``Message`` would carry (the worker's
        own hot path, :func:`worker.broker.publisher.json_properties`): the bench's shards share the
        machine with what they measure, so they cost as little as they can."""
        target = await self.exchange(exchange)
        assert self.publishing is not None, "the shard is not open"
        channel = await self.publishing.get_underlay_channel()
        properties = json_properties(message_id, correlation_id, type, headers)
        properties.user_id = self.user_id
        await channel.basic_publish(
            body,
            exchange=target.name,
            routing_key=routing_key,
            properties=properties,
            mandatory=mandatory,
            timeout=timeout,
        )

    async def close(self, *, delete_queues: bool) -> None:
        """Disconnect; with ``delete_queues`` first delete the two queues (nothing in them is wanted).

        Without it the queues outlive the shard, like a real shard's over a restart.
        """
        if self.connection is None:
            return
        if delete_queues:
            with contextlib.suppress(Exception):
                for queue in self.queues:
                    await asyncio.wait_for(queue.delete(if_unused=False, if_empty=False), CLOSE_TIMEOUT)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.connection.close(), CLOSE_TIMEOUT)
