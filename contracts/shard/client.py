"""``LtmClient``: a shard publishes ``create_long_term_memory`` events and awaits their typed results.

The Python counterpart of the TypeScript kit's client (contracts/typescript/README.md "What the client does"),
on aio-pika's robust connection:

- **Connecting** checks the three exchanges passively (a shard's user may not declare them), declares and
  binds the shard's durable queues ``tomori.shard.<id>.results`` and ``.notifications`` with ``shard.<id>``
  and consumes them with manual acks: all that user ``shard-<id>`` may do. A login or vhost RabbitMQ refuses
  fails :meth:`LtmClient.connect` at once, in words; a broker that does not answer is tried
  ``startup_retries`` more times. After that the connection recovers by itself (aio-pika restores the
  channels, queues, bindings and consumers).
- **Publishing** (:meth:`LtmClient.create_memory`): one event to ``tomori.tool_calls``, on a confirm channel,
  ``mandatory``, with every property of CONTRACT.md section 3, the AMQP ``user_id`` of the connection's user
  (who sent it, for the worker), and the shard's own routing key ``tool.<name>.shard.<id>``. A publish no
  queue takes (no worker has bound the shard's queue yet) comes back and goes again at once with
  ``tool.<name>``, as do the next events for ``per_shard_retry`` seconds. A nack is a full queue
  (:class:`~contracts.shard.errors.LtmBacklogFullError`). A publish the connection's loss interrupts goes
  again, with the same ``event_id``, once it is back: the worker answers a copy from its ledger
  (``replayed``), and the duplicate filter drops it. A call whose guild already has
  ``guild_in_flight_max`` (64) calls waiting is not published
  (:class:`~contracts.shard.errors.LtmGuildBusyError`).
- **Results** resolve the call waiting for their ``event_id`` (a :class:`contracts.models.ToolResult`);
  anything else is a late result (``on_late_result``), a copy with a status already seen is dropped.
- **Notices** go to ``on_notice`` once per ``event_id``, also after the call timed out. The notice, and the
  invalidation, may arrive before :meth:`~LtmClient.create_memory` returns: give your own ``event_id`` to know
  it beforehand.

This module connects and closes; the rest of the client is in its own modules:
:mod:`contracts.shard.publishing` (an event's checks, its publish and the broker's verdicts),
:mod:`contracts.shard.delivery` (results, notices and late results), :mod:`contracts.shard.seen` (the
duplicate filter) and :mod:`contracts.shard.broker` (routing keys, the URL's user, refusals in plain words).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Self

import aio_pika
import aiormq.exceptions
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)

from contracts.models import ShardQueueKind, Status, shard_queue
from contracts.names import (
    NOTIFICATIONS_EXCHANGE,
    TOOL_CALLS_EXCHANGE,
    TOOL_RESULTS_EXCHANGE,
    WORK_QUEUE,
    shard_routing_key,
    shard_work_queue,
)
from contracts.shard.broker import _broker_text, refusal_of, tool_routing_keys, user_of_url
from contracts.shard.delivery import LateResultInfo, LateResultReason, OnLateResult, OnNotice, _Delivery
from contracts.shard.errors import LtmClientError, LtmClosedError
from contracts.shard.publishing import _Call, _Publishing
from contracts.shard.seen import SeenSet as SeenSet

__all__ = [
    "CLOSE_DRAIN",
    "DEFAULT_TIMEOUT",
    "NOTIFICATIONS_EXCHANGE",
    "PER_SHARD_RETRY",
    "TOOL_CALLS_EXCHANGE",
    "TOOL_RESULTS_EXCHANGE",
    "WORK_QUEUE",
    "LateResultInfo",
    "LateResultReason",
    "LtmClient",
    "refusal_of",
    "shard_work_queue",
    "tool_routing_keys",
    "user_of_url",
]

log = logging.getLogger("contracts.shard")

#: how long a call waits for its result by default: the worker's retry budget (1 + 2 + 4 + 8 s) with room
DEFAULT_TIMEOUT = 30.0
#: how long :meth:`LtmClient.close` waits for ``on_notice`` / ``on_late_result`` callbacks still running
CLOSE_DRAIN = 5.0
#: how long the client uses ``tool.<name>`` after a per-shard publish came back unroutable
PER_SHARD_RETRY = 30.0
CONNECT_TIMEOUT = 10.0
#: how many calls of one guild may wait for their results at once (a shard's own queue is first in, first
#: out: this keeps one guild's runaway loop from filling it ahead of the shard's other guilds)
GUILD_IN_FLIGHT_MAX = 64


class LtmClient(_Publishing, _Delivery):
    """Publishes ``create_long_term_memory`` events and hands back their results (see the module's text)."""

    def __init__(
        self,
        url: str,
        shard_id: int,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        on_notice: OnNotice | None = None,
        on_late_result: OnLateResult | None = None,
        user_id: str | bool = True,
        per_shard_routing: bool = True,
        per_shard_retry: float = PER_SHARD_RETRY,
        prefetch: int = 32,
        dedupe_capacity: int = 100_000,
        dedupe_ttl: float = 86_400.0,
        guild_in_flight_max: int | None = GUILD_IN_FLIGHT_MAX,
    ) -> None:
        """Use :meth:`connect`, which also connects. ``user_id``: the AMQP ``user_id`` of every event (True:
        the URL's user, as RabbitMQ requires; a string: another name the broker authenticates the connection
        under; False: none, which a worker with ``LTM_SHARD_IDENTITY=required`` refuses).
        ``guild_in_flight_max``: how many calls of one guild (a direct message: of its channel) may wait
        for their results at once; one more raises :class:`LtmGuildBusyError` unpublished (None: no cap)."""
        if isinstance(shard_id, bool) or not isinstance(shard_id, int) or not 0 <= shard_id <= 2_147_483_647:
            raise ValueError(f"shard_id must be an integer 0..2147483647, got {shard_id!r}")
        if timeout <= 0:
            raise ValueError("timeout must be > 0 seconds")
        self.url = url
        self.shard_id = shard_id
        self.timeout = timeout
        self.on_notice = on_notice
        self.on_late_result = on_late_result
        self.user_id: str | None = (
            user_of_url(url) if user_id is True else None if user_id is False else str(user_id)
        )
        self.per_shard_routing = per_shard_routing
        self.per_shard_retry = per_shard_retry
        self.prefetch = prefetch
        if guild_in_flight_max is not None and guild_in_flight_max < 1:
            raise ValueError("guild_in_flight_max must be >= 1 (None: no cap)")
        self.guild_in_flight_max = guild_in_flight_max
        self._by_guild: dict[str, int] = {}
        self._results: SeenSet[Status] = SeenSet(dedupe_capacity, dedupe_ttl)
        self._notices: SeenSet[bool] = SeenSet(dedupe_capacity, dedupe_ttl)
        self._timed_out: SeenSet[bool] = SeenSet(dedupe_capacity, dedupe_ttl)
        self._pending: dict[str, _Call] = {}
        self._handling: set[asyncio.Task[Any]] = set()
        self._connection: AbstractRobustConnection | None = None
        self._consuming: AbstractChannel | None = None
        self._queues: list[tuple[AbstractQueue, str]] = []
        self._exchange: AbstractExchange | None = None
        self._common_key_until = 0.0
        self._per_shard_refused = False
        self._identity_refused: str | None = None
        self._closed = False

    # --- connecting and closing ---------------------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        url: str,
        shard_id: int,
        *,
        startup_retries: int = 5,
        connect_timeout: float = CONNECT_TIMEOUT,
        **options: Any,
    ) -> LtmClient:
        """Connect, check the exchanges, declare and bind this shard's queues and consume them. Raises
        :class:`LtmClientError` at once for a login or vhost RabbitMQ refuses, and when a broker that does not
        answer has failed ``startup_retries`` more attempts (0.2 s doubling). ``options``: those of the
        constructor (``timeout``, ``on_notice``, ``on_late_result``, ``user_id``, ...)."""
        client = cls(url, shard_id, **options)
        delay = 0.2
        for attempt in range(startup_retries + 1):
            try:
                client._connection = await aio_pika.connect_robust(
                    url,
                    timeout=connect_timeout,
                    client_properties={"connection_name": f"ltm-shard-{shard_id}"},
                )
                break
            except (TimeoutError, aiormq.exceptions.AMQPError, OSError) as error:
                plain = refusal_of(error, url)
                if plain is not None:
                    raise LtmClientError(plain) from error
                if attempt == startup_retries:
                    raise LtmClientError(f"cannot connect to RabbitMQ: {error}") from error
                log.warning("RabbitMQ connection attempt failed; retrying (%s)", error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        try:
            await client._setup()
        except BaseException as error:
            client._closed = True
            await client._connection_close()
            if isinstance(error, aiormq.exceptions.AMQPError):
                raise LtmClientError(
                    f"setting up shard {shard_id}'s queues failed: {_broker_text(error)} (the exchanges "
                    "come from the worker's start-up or deploy/rabbitmq/definitions.json; the shard's user "
                    f"may use only {shard_queue(shard_id, 'results')} and "
                    f"{shard_queue(shard_id, 'notifications')})"
                ) from error
            raise
        return client

    async def _setup(self) -> None:
        assert self._connection is not None
        consuming = await self._connection.channel()
        await consuming.set_qos(prefetch_count=self.prefetch)
        routing_key = shard_routing_key(self.shard_id)
        handlers: list[tuple[str, ShardQueueKind, Callable[[AbstractIncomingMessage], Awaitable[None]]]] = [
            (TOOL_RESULTS_EXCHANGE, "results", self._on_result_message),
            (NOTIFICATIONS_EXCHANGE, "notifications", self._on_notice_message),
        ]
        # passive checks only: a shard's user may not declare the exchanges (they come from the definitions)
        await consuming.get_exchange(TOOL_CALLS_EXCHANGE, ensure=True)
        for exchange_name, kind, handler in handlers:
            exchange = await consuming.get_exchange(exchange_name, ensure=True)
            queue = await consuming.declare_queue(shard_queue(self.shard_id, kind), durable=True)
            await queue.bind(exchange, routing_key)
            tag = await queue.consume(handler, no_ack=False)
            self._queues.append((queue, tag))
        self._consuming = consuming
        publishing = await self._connection.channel(publisher_confirms=True, on_return_raises=True)
        self._exchange = await publishing.get_exchange(TOOL_CALLS_EXCHANGE, ensure=False)
        log.info("connected to RabbitMQ as shard %d", self.shard_id)

    async def close(self) -> None:
        """Stop consuming and close the connection; calls still waiting fail with LtmClosedError. Every result
        or notice already handed to the shard is acked first (its callback is awaited, up to ``CLOSE_DRAIN``
        seconds), so the next process is not handed it again."""
        if self._closed:
            return
        self._closed = True
        for call in list(self._pending.values()):
            if not call.future.done():
                call.future.set_exception(LtmClosedError(call.event_id))
            if call.publisher is not None:
                call.publisher.cancel()
        for queue, tag in self._queues:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(queue.cancel(tag), CLOSE_DRAIN)
        if self._handling:
            _, running = await asyncio.wait(set(self._handling), timeout=CLOSE_DRAIN)
            if running:
                log.warning(
                    "closing with %d callbacks still running; their messages come again", len(running)
                )
        # the consuming channel's close goes behind its acks: the broker has them all when it answers
        if self._consuming is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._consuming.close(), CLOSE_DRAIN)
        await self._connection_close()

    async def _connection_close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._connection.close(), CLOSE_DRAIN)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- state ---------------------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """True while the connection is up."""
        return self._connection is not None and not self._connection.is_closed and not self._closed

    @property
    def in_flight(self) -> int:
        """Events published (or being published) and not answered yet."""
        return len(self._pending)

    @property
    def publishing_as(self) -> str | None:
        """The AMQP ``user_id`` the events carry (None: none)."""
        return self.user_id
