"""The shared header readers and the message copy that retries, dead letters and replays use."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any, cast

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage

from worker.broker import headers

PROPERTIES = {
    "content_type": "application/json",
    "content_encoding": "utf-8",
    "delivery_mode": aio_pika.DeliveryMode.PERSISTENT,
    "priority": 3,
    "correlation_id": "call-1",
    "reply_to": "somewhere",
    "expiration": 5,
    "message_id": "e-1",
    "timestamp": datetime(2026, 12, 2, 8, 0, tzinfo=UTC),
    "type": "tool_call.v1",
    "app_id": "shard",
}


def delivery(header_values: dict[str, Any] | None = None, **properties: Any) -> AbstractIncomingMessage:
    """What the readers and the copy use of an aio-pika delivery."""
    fields = {**PROPERTIES, "user_id": "shard-user", "routing_key": "tool.create", **properties}
    return cast(AbstractIncomingMessage, SimpleNamespace(body=b"{}", headers=header_values, **fields))


def test_a_copy_keeps_body_and_properties_swaps_headers_and_drops_the_user() -> None:
    copy = headers.copy_message(delivery({"old": 1}), {"new": 2})
    assert copy.body == b"{}"
    assert copy.headers == {"new": 2}
    assert copy.user_id is None
    for name, value in PROPERTIES.items():
        assert getattr(copy, name) == value, name


def test_a_copy_takes_overrides_and_a_missing_delivery_mode_becomes_persistent() -> None:
    copy = headers.copy_message(delivery(delivery_mode=None), {}, expiration=None, priority=9)
    assert copy.expiration is None
    assert copy.priority == 9
    assert copy.delivery_mode == aio_pika.DeliveryMode.PERSISTENT


@pytest.mark.parametrize(
    ("value", "attempts"), [(None, 0), (2, 2), (0, 0), (-1, 0), (True, 0), ("3", 0), (b"3", 0)]
)
def test_only_a_positive_integer_counts_as_attempts(value: Any, attempts: int) -> None:
    message = delivery(None if value is None else {headers.ATTEMPTS: value})
    assert headers.attempts_made(message) == attempts


def test_string_headers_may_arrive_as_bytes() -> None:
    message = delivery({headers.TRACEPARENT: b"00-ab-cd-01", headers.ORIGINAL_ROUTING_KEY: b"tool.kept"})
    assert headers.traceparent_of(message) == "00-ab-cd-01"
    assert headers.original_routing_key(message) == "tool.kept"
    assert headers.header_text(42) is None


def test_without_the_headers_the_delivery_says_it() -> None:
    message = delivery({headers.TRACEPARENT: "", headers.ORIGINAL_ROUTING_KEY: ""})
    assert headers.traceparent_of(message) is None
    assert headers.original_routing_key(message) == "tool.create"
    assert headers.original_routing_key(delivery(None, routing_key=None)) == ""


def test_rfc3339_is_utc_with_milliseconds_and_a_z() -> None:
    moment = datetime(2026, 12, 2, 10, 0, 0, 120_456, tzinfo=timezone(timedelta(hours=2)))
    assert headers.rfc3339(moment) == "2026-12-02T08:00:00.120Z"
