"""A tool-call event as the bot publishes it (CONTRACT.md "Tool-call event"), for the programs that stand in
for the bot: ``worker demo send`` and the benchmarks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aio_pika

TOOL_CALL_TYPE = "tool_call.v1"


def tool_call_message(event: Mapping[str, Any], body: bytes, **properties: Any) -> aio_pika.Message:
    """``body`` (the event encoded) with the contract's properties: JSON, persistent, ``message_id`` the
    event id, ``correlation_id`` the tool call id, type ``tool_call.v1``; ``properties`` adds others
    (``app_id``, ``headers``...)."""
    return aio_pika.Message(
        body,
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=event["event_id"],
        correlation_id=event["tool_call_id"],
        type=TOOL_CALL_TYPE,
        **properties,
    )
