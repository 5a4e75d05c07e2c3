"""A tool result's message body is the JSON a shard has always received: the bytes of the JSON-mode dump
through orjson (what the worker sent before the result stayed typed until the publisher)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import orjson
import pytest

from contracts.models import SAVED_MESSAGE, Status, ToolResult
from worker.broker.publisher import result_body
from worker.pipeline import outcome

EVERY_BMP_CHARACTER = "".join(chr(c) for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF)
TRICKY = ["\u2028\u2029", "😀\U0010ffff", "</script>\\\"'\x00\x1f\x7f", "{user} likes \t tea\n", ""]


def saved_result(content: str, processed_at: datetime) -> ToolResult:
    data = {"status": Status.SAVED, "scope": "target_user", "target_user": content, "memory_id": 2**40}
    return ToolResult(
        event_id=uuid.uuid4(),
        tool_call_id=content or "call_1",
        tool_name="remember_this_fact",
        success=True,
        status=Status.SAVED,
        message=SAVED_MESSAGE,
        error=None,
        data={**data, "content_saved": content},
        processed_at=processed_at,
        replayed=True,
    )


@pytest.mark.parametrize(
    "processed_at",
    [datetime(2026, 12, 3, 10, tzinfo=UTC), datetime(2026, 12, 3, 10, 0, 14, 1500, tzinfo=UTC)],
)
@pytest.mark.parametrize(
    "text", [EVERY_BMP_CHARACTER[k : k + 4096] for k in range(0, 0x10000, 4096)] + TRICKY
)
def test_the_body_is_the_orjson_dump_of_the_json_mode_result(text: str, processed_at: datetime) -> None:
    for result in (
        saved_result(text, processed_at),
        outcome.ambiguous_user(text, (text, "b")).result(saved_result(text, processed_at), processed_at),
    ):
        assert result_body(result) == orjson.dumps(result.model_dump(mode="json"))
