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


#: RabbitMQ's default frame_max
FRAME_MAX = 131_072


def delivery(header_values: dict[str, Any] | None = None, **properties: Any) -> AbstractIncomingMessage:
    """What the readers and the copy use of an aio-pika delivery (a shard's, unless ``exchange=""``: the
    worker's own retry copy)."""
    fields = {
        **PROPERTIES,
        "user_id": "shard-user",
        "routing_key": "tool.create",
        "exchange": "tomori.tool_calls",
        **properties,
    }
    return cast(AbstractIncomingMessage, SimpleNamespace(body=b"{}", headers=header_values, **fields))


def test_a_copy_keeps_body_and_properties_swaps_headers_and_drops_the_user() -> None:
    copy = headers.copy_message(delivery({"old": 1}), {"new": 2}, frame_max=FRAME_MAX)
    assert copy.body == b"{}"
    assert copy.headers == {"new": 2}
    assert copy.user_id is None
    for name, value in PROPERTIES.items():
        assert getattr(copy, name) == value, name


def test_a_copy_takes_overrides_and_a_missing_delivery_mode_becomes_persistent() -> None:
    copy = headers.copy_message(
        delivery(delivery_mode=None), {}, frame_max=FRAME_MAX, expiration=None, priority=9
    )
    assert copy.expiration is None
    assert copy.priority == 9
    assert copy.delivery_mode == aio_pika.DeliveryMode.PERSISTENT


@pytest.mark.parametrize(
    ("value", "attempts"), [(None, 0), (2, 2), (0, 0), (-1, 0), (True, 0), ("3", 0), (b"3", 0)]
)
def test_only_a_positive_integer_counts_as_attempts(value: Any, attempts: int) -> None:
    message = delivery(None if value is None else {headers.ATTEMPTS: value}, exchange="")
    assert headers.attempts_made(message) == attempts


def test_a_shard_cannot_set_the_worker_only_headers() -> None:
    forged = {
        headers.ATTEMPTS: 999,
        headers.ORIGINAL_ROUTING_KEY: "tool.some_other_tool",
        headers.ERROR_KIND: "internal",
        headers.DROPPED: ["nothing"],
        headers.TRACEPARENT: "00-ab-cd-01",
        "custom": 1,
    }
    shards = delivery(forged)
    assert headers.attempts_made(shards) == 0
    assert headers.original_routing_key(shards) == "tool.create"
    assert headers.own_headers(shards) == {headers.TRACEPARENT: "00-ab-cd-01", "custom": 1}
    # the same headers on the worker's own retry copy (back through the default exchange) are believed
    retry = delivery(forged, exchange="", routing_key="ltm.create_memory")
    assert headers.attempts_made(retry) == 999
    assert headers.original_routing_key(retry) == "tool.some_other_tool"
    assert headers.own_headers(retry) == forged


def test_a_copy_that_would_not_fit_the_frame_drops_the_largest_original_headers() -> None:
    big, bigger = "b" * 60_000, "c" * 80_000
    original = {"small": 1, "big": big, "bigger": bigger, headers.TRACEPARENT: "00-ab-cd-01"}
    added = {**original, headers.ERROR: "envelope breaks the contract", headers.ERROR_KIND: "schema"}
    copy = headers.copy_message(delivery(original), added, frame_max=FRAME_MAX)
    size = 20 + len(copy.properties.marshal())
    assert size <= FRAME_MAX
    assert copy.headers is not None
    assert "bigger" not in copy.headers  # the largest goes first, and it was enough
    assert copy.headers["big"] == big
    assert copy.headers[headers.ERROR_KIND] == "schema"
    assert copy.headers[headers.TRACEPARENT] == "00-ab-cd-01"
    [note] = copy.headers[headers.DROPPED]
    assert note.startswith("headers.bigger: ")
    assert note.endswith("dropped to fit the frame")


@pytest.mark.parametrize("frame_max", [4_096, 8_192, 131_072])
def test_a_copy_always_fits_however_many_headers_and_whatever_the_frame(frame_max: int) -> None:
    many = {f"h{n:05d}": "x" * 300 for n in range(440)}  # about 133 KB of entries
    added = {**many, headers.ERROR: "e" * 500, headers.ERROR_KIND: "malformed", headers.ATTEMPTS: 1}
    copy = headers.copy_message(delivery(many), added, frame_max=frame_max)
    assert 20 + len(copy.properties.marshal()) <= frame_max
    assert copy.headers is not None
    assert copy.headers[headers.ERROR_KIND] == "malformed"
    assert len(copy.headers[headers.DROPPED]) <= 20


def test_what_the_decoder_left_out_travels_as_dropped_notes() -> None:
    original = {"x-ltm-undecodable": ["timestamp: 1796328516693743 is out of range"], "k": 1}
    copy = headers.copy_message(delivery(original), dict(original), frame_max=FRAME_MAX)
    assert copy.headers == {"k": 1, headers.DROPPED: ["timestamp: 1796328516693743 is out of range"]}


def test_string_headers_may_arrive_as_bytes() -> None:
    message = delivery(
        {headers.TRACEPARENT: b"00-ab-cd-01", headers.ORIGINAL_ROUTING_KEY: b"tool.kept"}, exchange=""
    )
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


def test_a_copy_encodes_what_the_decoder_kept_that_the_encoder_refuses() -> None:
    """Found by the AMQP fuzzer: a long string that is not UTF-8 decodes to bytes, a timestamp past int64 is
    kept as its integer, pamqp reads tables ~900 deep; its encoder takes none of them."""
    deep: dict[str, Any] = {}
    level = deep
    for _ in range(900):
        level["d"] = {}
        level = level["d"]
    original = {"raw": b"\xff\xfe", "late": 2**64 - 1, "deep": deep, "fine": "ok"}
    copy = headers.copy_message(delivery(original), dict(original), frame_max=FRAME_MAX)
    assert copy.headers is not None
    assert copy.headers["raw"] == bytearray(b"\xff\xfe")
    assert copy.headers["late"] == str(2**64 - 1)
    assert copy.headers["fine"] == "ok"
    [note] = copy.headers[headers.DROPPED]
    assert note.startswith("headers.deep.d.d.")
    assert note.endswith("nested deeper than 64 levels")
    assert 20 + len(copy.properties.marshal()) <= FRAME_MAX


def test_a_copy_encodes_doubles_and_decimals_pamqp_would_refuse() -> None:
    """Found by the AMQP fuzzer: pamqp encodes every float as 32 bits, so a double past that range (decoded
    from a `d` value) raised OverflowError and the dead letter was never published."""
    original = {"big": 1e300, "small": 1.5, "nan": float("nan")}
    copy = headers.copy_message(delivery(original), dict(original), frame_max=FRAME_MAX)
    assert copy.headers is not None
    assert copy.headers["big"] == "1e+300"
    assert copy.headers["small"] == 1.5
    assert 20 + len(copy.properties.marshal()) <= FRAME_MAX


def test_a_copy_that_needs_both_a_fix_up_and_room_keeps_both_notes() -> None:
    deep: dict[str, Any] = {}
    level = deep
    for _ in range(900):
        level["d"] = {}
        level = level["d"]
    original = {"deep": deep, "big": "x" * 140_000}
    copy = headers.copy_message(delivery(original), dict(original), frame_max=FRAME_MAX)
    assert copy.headers is not None
    first, second = copy.headers[headers.DROPPED]
    assert first.endswith("nested deeper than 64 levels")
    assert second.startswith("headers.big: ")
    assert 20 + len(copy.properties.marshal()) <= FRAME_MAX
