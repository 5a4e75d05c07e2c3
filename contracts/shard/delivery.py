"""Results and notices on their way to the shard: each message of the shard's two queues is parsed, handed
to the call waiting for its ``event_id`` (a result) or to ``on_notice`` (once per ``event_id``), then acked;
a result no call waits for is a late result (``on_late_result``, with :class:`LateResultInfo` saying why),
a copy with a status already seen is dropped."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from aio_pika.abc import AbstractIncomingMessage
from pydantic import BaseModel, ValidationError

from contracts.models import Notification, Status, ToolResult
from contracts.shard.publishing import _Call
from contracts.shard.seen import SeenSet

log = logging.getLogger("contracts.shard")

LateResultReason = Literal["timed_out", "unknown", "different_status"]
OnNotice = Callable[[Notification], Awaitable[None] | None]
OnLateResult = Callable[[ToolResult, "LateResultInfo"], Awaitable[None] | None]

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class LateResultInfo:
    """Why a result went to ``on_late_result`` instead of a call."""

    #: ``timed_out``: the call had already failed with LtmTimeoutError; ``unknown``: no call of this client
    #: waits for it (the shard restarted, or the call was closed); ``different_status``: a second result with
    #: another status for an event already answered (a replayed dead letter)
    reason: LateResultReason
    #: the status this client saw first for the event, for ``different_status``
    previous_status: Status | None = None


async def _maybe_await(value: Awaitable[None] | None) -> None:
    if value is not None:
        await value


class _Delivery:
    """:class:`~contracts.shard.client.LtmClient`'s results and notices (the client sets up its state)."""

    on_notice: OnNotice | None
    on_late_result: OnLateResult | None
    _results: SeenSet[Status]
    _notices: SeenSet[bool]
    _timed_out: SeenSet[bool]
    _pending: dict[str, _Call]
    _handling: set[asyncio.Task[Any]]

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
