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
  (``replayed``), and the duplicate filter drops it.
- **Results** resolve the call waiting for their ``event_id`` (a :class:`contracts.models.ToolResult`);
  anything else is a late result (``on_late_result``), a copy with a status already seen is dropped.
- **Notices** go to ``on_notice`` once per ``event_id``, also after the call timed out. The notice, and the
  invalidation, may arrive before :meth:`~LtmClient.create_memory` returns: give your own ``event_id`` to know
  it beforehand.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, Literal, Self, TypeVar
from urllib.parse import unquote, urlsplit

import aio_pika
import aio_pika.exceptions
import aiormq.exceptions
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)
from pydantic import BaseModel, ValidationError

from contracts.models import (
    EVENT_TYPE,
    MAX_BODY_BYTES,
    EventContext,
    Notification,
    ShardQueueKind,
    Status,
    ToolName,
    ToolResult,
    shard_queue,
)
from contracts.names import (
    NOTIFICATIONS_EXCHANGE,
    TOOL_CALLS_EXCHANGE,
    TOOL_RESULTS_EXCHANGE,
    TRACEPARENT_HEADER,
    WORK_QUEUE,
    shard_routing_key,
    shard_tool_routing_key,
    shard_work_queue,
    tool_routing_key,
)
from contracts.shard.errors import (
    InvalidEventError,
    LtmBacklogFullError,
    LtmClientError,
    LtmClosedError,
    LtmEventTooLargeError,
    LtmGuildBusyError,
    LtmIdentityError,
    LtmPublishRefusedError,
    LtmTimeoutError,
    LtmUnroutableError,
)

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

LateResultReason = Literal["timed_out", "unknown", "different_status"]
OnNotice = Callable[[Notification], Awaitable[None] | None]
OnLateResult = Callable[[ToolResult, "LateResultInfo"], Awaitable[None] | None]

V = TypeVar("V")
M = TypeVar("M", bound=BaseModel)

#: the channel and connection troubles a publish is tried again after (the connection recovers by itself)
_TRANSIENT = (
    aiormq.exceptions.AMQPError,
    aio_pika.exceptions.ChannelInvalidStateError,
    ConnectionError,
    OSError,
)


@dataclass(frozen=True, slots=True)
class LateResultInfo:
    """Why a result went to ``on_late_result`` instead of a call."""

    #: ``timed_out``: the call had already failed with LtmTimeoutError; ``unknown``: no call of this client
    #: waits for it (the shard restarted, or the call was closed); ``different_status``: a second result with
    #: another status for an event already answered (a replayed dead letter)
    reason: LateResultReason
    #: the status this client saw first for the event, for ``different_status``
    previous_status: Status | None = None


def tool_routing_keys(tool_name: str, shard_id: int) -> tuple[str, str]:
    """The routing keys of a tool's events: ``tool.<name>`` (version 1, the common work queue) and the shard's
    own ``tool.<name>.shard.<id>`` (its queue ``ltm.create_memory.shard.<id>``, once the workers bound it)."""
    common = tool_routing_key(tool_name)
    return common, shard_tool_routing_key(common, shard_id)


def user_of_url(url: str) -> str:
    """The user aio-pika logs in as for ``url``: the URL's, percent-decoded; ``guest`` when it has none."""
    return unquote(urlsplit(url).username or "") or "guest"


def refusal_of(error: BaseException, url: str) -> str | None:
    """The plain sentence for a connection RabbitMQ refused while opening (a login it does not accept, a vhost
    that does not exist or the user may not use), or None for any other failure."""
    parts = urlsplit(url)
    user = unquote(parts.username or "") or "guest"
    vhost = unquote(parts.path[1:]) or "/"
    text = str(error)
    if isinstance(error, aiormq.exceptions.ProbableAuthenticationError) or "ACCESS_REFUSED" in text:
        return (
            f'RabbitMQ refused the login of user "{user}" (ACCESS_REFUSED): check the user and password in '
            f"the URL ({text})"
        )
    if "Connection.OpenOk" in text and "Connection.Close" in text:
        return (
            f'RabbitMQ refused vhost "{vhost}" to user "{user}": the vhost does not exist or the user has no '
            f"permissions on it (rabbitmqctl list_vhosts; rabbitmqctl list_user_permissions {user})"
        )
    return None


class SeenSet(Generic[V]):
    """A bounded memory of keys seen recently: at most ``capacity`` entries, each forgotten ``ttl`` seconds
    after it was stored (the oldest go first when full)."""

    def __init__(self, capacity: int, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        if capacity <= 0 or ttl <= 0:
            raise ValueError("capacity and ttl must be > 0")
        self.capacity, self.ttl, self._clock = capacity, ttl, clock
        self._entries: OrderedDict[str, tuple[V, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self._clock() - entry[1] >= self.ttl:
            del self._entries[key]
            return None
        return entry[0]

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def set(self, key: str, value: V) -> None:
        now = self._clock()
        self._entries.pop(key, None)
        self._entries[key] = (value, now)
        while self._entries:
            oldest, (_, at) = next(iter(self._entries.items()))
            if len(self._entries) <= self.capacity and now - at < self.ttl:
                break
            del self._entries[oldest]


@dataclass
class _Call:
    event_id: str
    tool_call_id: str
    tool_name: str
    body: bytes
    headers: dict[str, str]
    future: asyncio.Future[ToolResult]
    publisher: asyncio.Task[None] | None = field(default=None, repr=False)


async def _maybe_await(value: Awaitable[None] | None) -> None:
    if value is not None:
        await value


class LtmClient:
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

    def routing_key_for(self, tool_name: str = "create_long_term_memory") -> str:
        """The routing key the next event of ``tool_name`` goes with."""
        common, own = tool_routing_keys(tool_name, self.shard_id)
        per_shard = (
            self.per_shard_routing
            and not self._per_shard_refused
            and time.monotonic() >= self._common_key_until
        )
        return own if per_shard else common

    # --- publishing ----------------------------------------------------------------------------------------

    async def create_memory(
        self,
        *,
        tool_call_id: str,
        arguments: Any,
        context: EventContext | Mapping[str, Any],
        tool_name: ToolName = "create_long_term_memory",
        event_id: str | uuid.UUID | None = None,
        traceparent: str | None = None,
        timeout: float | None = None,
        issued_at: datetime | None = None,
    ) -> ToolResult:
        """Publish one tool-call event and return its result.

        Raises :class:`LtmTimeoutError` when no result arrives in time (the memory may still be saved; pass
        the same ``event_id`` again to retry, the worker answers from its ledger), :class:`LtmUnroutableError`
        when nothing is bound to the routing key, :class:`LtmBacklogFullError` when the queue is at its bound,
        :class:`LtmIdentityError` / :class:`LtmPublishRefusedError` when RabbitMQ refuses the ``user_id`` or
        the routing key, :class:`LtmClosedError` on :meth:`close`, and at once :class:`LtmEventTooLargeError`
        for a body over 256 KiB or :class:`InvalidEventError` for a context the contract does not allow.
        """
        if self._closed:
            raise LtmClosedError(None)
        event_id = _canonical_event_id(event_id)
        if self._identity_refused is not None:
            raise LtmIdentityError(event_id, self.user_id or "", self._identity_refused)
        if event_id in self._pending:
            raise ValueError(f"event {event_id} is already waiting for its result")
        checked = _checked_context(context)
        body = self._event_body(event_id, tool_call_id, tool_name, arguments, checked, issued_at)
        if len(body) > MAX_BODY_BYTES:
            raise LtmEventTooLargeError(event_id, len(body))
        guild = checked.tenant
        waiting = self._by_guild.get(guild, 0)
        if self.guild_in_flight_max is not None and waiting >= self.guild_in_flight_max:
            raise LtmGuildBusyError(event_id, guild, waiting)
        self._by_guild[guild] = waiting + 1
        wait = self.timeout if timeout is None else timeout
        headers = {} if traceparent is None else {TRACEPARENT_HEADER: traceparent}
        future: asyncio.Future[ToolResult] = asyncio.get_running_loop().create_future()
        call = _Call(event_id, tool_call_id, tool_name, body, headers, future)
        self._pending[event_id] = call
        call.publisher = asyncio.create_task(self._publish(call), name=f"ltm-publish-{event_id}")
        try:
            async with asyncio.timeout(wait):
                return await asyncio.shield(future)
        except TimeoutError as error:
            if isinstance(error, LtmClientError):
                raise
            self._timed_out.set(event_id, True)
            raise LtmTimeoutError(event_id, tool_call_id, wait) from None
        finally:
            self._pending.pop(event_id, None)
            if (left := self._by_guild[guild] - 1) > 0:
                self._by_guild[guild] = left
            else:
                del self._by_guild[guild]
            if not call.publisher.done():
                call.publisher.cancel()
            if not future.done():
                future.cancel()

    def _event_body(
        self,
        event_id: str,
        tool_call_id: str,
        tool_name: str,
        arguments: Any,
        checked: EventContext,
        issued_at: datetime | None,
    ) -> bytes:
        when = (issued_at or datetime.now(UTC)).isoformat().replace("+00:00", "Z")
        event = {
            "schema_version": 1,
            "event_id": event_id,
            "tool_call_id": tool_call_id,
            "tool_name": tool_name,
            "issued_at": when,
            "shard_id": self.shard_id,
            "arguments": arguments,
            "context": checked.model_dump(mode="json"),
        }
        return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()

    def _message(self, call: _Call) -> aio_pika.Message:
        return aio_pika.Message(
            call.body,
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=call.event_id,
            correlation_id=call.tool_call_id,
            type=EVENT_TYPE,
            headers=dict(call.headers),
            user_id=self.user_id,
        )

    def _fail(self, call: _Call, error: BaseException) -> None:
        if not call.future.done():
            call.future.set_exception(error)

    async def _publish(self, call: _Call) -> None:
        """Publish until the broker confirms; fail the call on a verdict; again after a lost connection."""
        routing_key = self.routing_key_for(call.tool_name)
        common, _ = tool_routing_keys(call.tool_name, self.shard_id)
        delay = 0.05
        while not self._closed and not call.future.done():
            if self._identity_refused is not None:
                self._fail(call, LtmIdentityError(call.event_id, self.user_id or "", self._identity_refused))
                return
            try:
                if self._exchange is None:
                    raise ConnectionError("not connected")
                await self._exchange.publish(self._message(call), routing_key=routing_key, mandatory=True)
                return
            except aio_pika.exceptions.PublishError as error:
                # basic.return: no queue took it
                if routing_key == common:
                    reply = getattr(error.frame, "reply_text", "NO_ROUTE")
                    self._fail(call, LtmUnroutableError(call.event_id, routing_key, str(reply)))
                    return
                self._no_queue_for_own_key(routing_key)
                routing_key = common
                continue
            except aio_pika.exceptions.DeliveryError:
                # basic.nack: the queue it was routed to is at its bound
                per_shard = routing_key != common
                queue = shard_work_queue(self.shard_id) if per_shard else WORK_QUEUE
                self._fail(
                    call, LtmBacklogFullError(call.event_id, self.shard_id, routing_key, queue, per_shard)
                )
                return
            except aiormq.exceptions.ChannelPreconditionFailed as error:
                if "user_id" in str(error):
                    self._identity_refused = _broker_text(error)
                    log.error(
                        "RabbitMQ refused the events' user_id %r: set the user_id option to the user it "
                        "authenticates (%s)",
                        self.user_id,
                        self._identity_refused,
                    )
                    continue
                await self._pause(delay)
            except aiormq.exceptions.ChannelAccessRefused as error:
                refused = _refused_topic(error)
                if refused == routing_key and routing_key != common:
                    if not self._per_shard_refused:
                        self._per_shard_refused = True
                        log.warning(
                            "RabbitMQ refused this shard's own routing key %s (the user's topic permission "
                            "on tomori.tool_calls predates it; deploy/rabbitmq/shard_users.py writes the new "
                            "one): events go with tool.<name> until the client restarts (%s)",
                            routing_key,
                            _broker_text(error),
                        )
                    routing_key = common
                    await self._pause(delay)  # the channel comes back by itself
                    continue
                if refused == routing_key:
                    self._fail(call, LtmPublishRefusedError(call.event_id, routing_key, _broker_text(error)))
                    return
                await self._pause(delay)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self._closed or call.future.done() or (task is not None and task.cancelling()):
                    raise
                # aiormq cancels a confirm its channel lost: no verdict, publish again
                await self._pause(delay)
            except _TRANSIENT as error:
                log.debug("publish of %s interrupted (%s); trying again", call.event_id, error)
                await self._pause(delay)
            delay = min(delay * 2, 1.0)
            routing_key = self.routing_key_for(call.tool_name)

    async def _pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def _no_queue_for_own_key(self, routing_key: str) -> None:
        now = time.monotonic()
        if now >= self._common_key_until:
            log.debug(
                "no queue takes %s yet; events go with tool.<name> for %g s",
                routing_key,
                self.per_shard_retry,
            )
        self._common_key_until = max(self._common_key_until, now + self.per_shard_retry)

    # --- results and notices -------------------------------------------------------------------------------

    async def _on_result_message(self, message: AbstractIncomingMessage) -> None:
        await self._deliver(message, ToolResult, self._on_result, "result")

    async def _on_notice_message(self, message: AbstractIncomingMessage) -> None:
        await self._deliver(message, Notification, self._on_notice, "notice")

    async def _deliver(
        self,
        message: AbstractIncomingMessage,
        model: type[M],
        handle: Callable[[M], Awaitable[None]],
        kind: str,
    ) -> None:
        """Parse, hand over, then ack (also after a failed callback: it is logged; a crash before the ack gets
        the message again, and the filters drop a copy already handled)."""
        task = asyncio.current_task()
        if task is not None:
            self._handling.add(task)
        try:
            try:
                parsed = model.model_validate_json(message.body)
            except ValidationError:
                log.warning(
                    "dropped a %s that is not a contract message (message_id %s)", kind, message.message_id
                )
            else:
                try:
                    await handle(parsed)
                except Exception:
                    log.exception("the %s callback failed", kind)
            with contextlib.suppress(Exception):
                await message.ack()
        finally:
            if task is not None:
                self._handling.discard(task)

    async def _on_result(self, result: ToolResult) -> None:
        event_id = str(result.event_id)
        previous = self._results.get(event_id)
        call = self._pending.get(event_id)
        if call is not None and not call.future.done():
            # a waiting call takes the first result for its event id, also a replayed one (a retried call)
            self._results.set(event_id, result.status)
            call.future.set_result(result)
            return
        if previous == result.status:
            log.debug("duplicate result dropped: %s %s", event_id, result.status)
            return
        self._results.set(event_id, result.status)
        if previous is not None:
            await self._late(result, LateResultInfo("different_status", previous))
        else:
            await self._late(
                result, LateResultInfo("timed_out" if event_id in self._timed_out else "unknown")
            )

    async def _late(self, result: ToolResult, info: LateResultInfo) -> None:
        if self.on_late_result is not None:
            await _maybe_await(self.on_late_result(result, info))
            return
        log.warning(
            "a result no call waits for: event %s, tool call %s, %s (%s)",
            result.event_id,
            result.tool_call_id,
            result.status,
            info.reason,
        )

    async def _on_notice(self, notification: Notification) -> None:
        event_id = str(notification.event_id)
        if event_id in self._notices:
            log.debug("duplicate notice dropped: %s", event_id)
            return
        self._notices.set(event_id, True)
        if self.on_notice is not None:
            await _maybe_await(self.on_notice(notification))


def _checked_context(context: EventContext | Mapping[str, Any]) -> EventContext:
    try:
        return context if isinstance(context, EventContext) else EventContext.model_validate(context)
    except ValidationError as error:
        raise InvalidEventError(f"the event's context is not the contract's: {error}") from error


def _canonical_event_id(event_id: str | uuid.UUID | None) -> str:
    if event_id is None:
        return str(uuid.uuid4())
    try:
        canonical = str(uuid.UUID(str(event_id)))
    except ValueError as error:
        raise InvalidEventError(f"event_id {event_id!r} is not a UUID") from error
    if isinstance(event_id, str) and event_id != canonical:
        raise InvalidEventError(
            f"event_id {event_id!r} is not in canonical form ({canonical}): the worker accepts only that"
        )
    return canonical


def _broker_text(error: BaseException) -> str:
    """The broker's own sentence out of an aiormq channel error."""
    text = str(error)
    match = re.search(r'"([A-Z_]+ - .*)"\s*$', text)
    return match.group(1) if match else text


def _refused_topic(error: BaseException) -> str | None:
    """The routing key of a topic permission refusal on tomori.tool_calls, else None."""
    match = re.search(
        r"access to topic '([^']*)' in exchange '" + re.escape(TOOL_CALLS_EXCHANGE) + "'", str(error)
    )
    return match.group(1) if match else None
