"""Results and notices leave on aiormq's channel with properties the publisher builds itself: their content
header must be byte for byte what aio-pika's ``Message`` gave before (what shards have always received)."""

from __future__ import annotations

import aio_pika
import pytest
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from contracts.models import NOTIFICATION_TYPE, RESULT_TYPE
from worker.broker.publisher import json_properties

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def header_bytes(properties: Basic.Properties, size: int = 321) -> bytes:
    return ContentHeader(0, size, properties).marshal()


@pytest.mark.parametrize("kind", [RESULT_TYPE, NOTIFICATION_TYPE])
@pytest.mark.parametrize("headers", [None, {"traceparent": TRACEPARENT}])
def test_json_properties_are_the_bytes_an_aio_pika_message_gives(
    kind: str, headers: dict[str, str] | None
) -> None:
    message_id, correlation_id = "result:8c1d0e52-5b40-4bb5-9d89-64e42c1e4f41", "call_9"
    before = aio_pika.Message(
        b"{}",
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=message_id,
        correlation_id=correlation_id,
        type=kind,
        headers=headers,
    ).properties
    now = json_properties(message_id, correlation_id, kind, headers)
    assert header_bytes(now) == header_bytes(before)
    assert now.delivery_mode == 2
    assert now.message_type == kind
