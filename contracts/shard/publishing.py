"""Publishing an event: :meth:`~contracts.shard.client.LtmClient.create_memory` checks it (its ``event_id``,
its ``context``, its size, its guild's calls in flight), publishes it on the confirm channel with the shard's
own routing key or ``tool.<name>``, and turns the broker's verdict (a return, a nack, a refused ``user_id`` or
routing key) into the call's typed error; a publish a lost connection interrupted goes again."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aio_pika
import aio_pika.exceptions
import aiormq.exceptions
from aio_pika.abc import AbstractExchange
from pydantic import ValidationError

from contracts.models import EVENT_TYPE, MAX_BODY_BYTES, EventContext, ToolName, ToolResult
from contracts.names import TRACEPARENT_HEADER, WORK_QUEUE, shard_work_queue
from contracts.shard.broker import _broker_text, _refused_topic, tool_routing_keys
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
from contracts.shard.seen import SeenSet

log = logging.getLogger("contracts.shard")

#: the channel and connection troubles a publish is tried again after (the connection recovers by itself)
_TRANSIENT = (
    aiormq.exceptions.AMQPError,
    aio_pika.exceptions.ChannelInvalidStateError,
    ConnectionError,
    OSError,
)


@dataclass
class _Call:
    event_id: str
    tool_call_id: str
    tool_name: str
    body: bytes
    headers: dict[str, str]
    future: asyncio.Future[ToolResult]
    publisher: asyncio.Task[None] | None = field(default=None, repr=False)


class _Publishing:
    """:class:`~contracts.shard.client.LtmClient`'s publishing (the client sets up its state)."""

    shard_id: int
    timeout: float
    user_id: str | None
    per_shard_routing: bool
    per_shard_retry: float
    guild_in_flight_max: int | None
    _by_guild: dict[str, int]
    _timed_out: SeenSet[bool]
    _pending: dict[str, _Call]
    _exchange: AbstractExchange | None
    _common_key_until: float
    _per_shard_refused: bool
    _identity_refused: str | None
    _closed: bool

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
