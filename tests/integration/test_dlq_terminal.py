"""``worker dlq list``/``show`` print a shard's text to the operator's terminal: control characters arrive
escaped (never an ESC sequence, a carriage return or a line feed of the shard's), a body nested 10,000 deep
is shown (exit 0, not a RecursionError read as "not found"); ``--json`` keeps the text, JSON-escaped."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta

import aio_pika

from tests.integration.test_dlq import (
    MAIN_KEY,
    Broker,
    audit_database,  # noqa: F401  (the fixture: list and show read the letters kept there)
    broker,  # noqa: F401  (the fixture)
    cli,
    dead_letter_copy,
    shard_message,
)

#: what a terminal would act on: ESC sequences (clear screen, title, colour), CR, LF, BEL, the 8-bit CSI,
#: a right-to-left override
EVIL = "\x1b[2J\x1b]0;pwned\x07\r\nALL DEAD LETTERS REPLAYED OK\x9b31m\u202e"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]")


def no_raw_controls(text: str) -> None:
    """Only the lines' own line feeds: no other control character reached the terminal."""
    assert RAW.search(text) is None, repr(text)


async def test_list_and_show_escape_what_the_shard_wrote(broker: Broker) -> None:  # noqa: F811
    event_id = f"{uuid.uuid4()}{EVIL}"
    body = {"event_id": event_id, "shard_id": 3, "arguments": {"memory_content": EVIL}}
    message = shard_message(json.dumps(body).encode(), event_id=event_id)
    message.headers = {**(message.headers or {}), f"x-note{EVIL}": EVIL, "x-nested": {"k": [EVIL]}}
    await dead_letter_copy(
        broker,
        message,
        MAIN_KEY,
        kind=f"internal{EVIL}",
        error=f"boom{EVIL}",
        attempts=1,
        failed_at=datetime.now(UTC) - timedelta(minutes=1),
    )
    await broker.wait_depth("ltm.create_memory.dlq", 1)

    listed = await cli("list", url=broker.url)
    assert listed.code == 0, listed.err
    no_raw_controls(listed.out)
    lines = listed.out.splitlines()
    assert len(lines) == 2  # the header and one row: no line of the shard's
    assert lines[1].startswith(event_id.split("\x1b")[0] + "\\x1b[2J\\x1b]0;pwned\\x07\\r\\nALL DEAD")
    assert "boom\\x1b[2J" in lines[1]
    assert "\\x9b31m\\u202e" in lines[1]

    shown = await cli("show", event_id, url=broker.url)
    assert shown.code == 0, shown.err
    no_raw_controls(shown.out)
    assert not any(line.startswith("ALL DEAD LETTERS") for line in shown.out.splitlines())
    assert "x-note\\x1b[2J" in shown.out  # a header's name
    assert "  x-ltm-error: boom\\x1b[2J" in shown.out  # a header's value
    assert "message_id: " + event_id.split("\x1b")[0] + "\\x1b[2J" in shown.out  # a property
    assert '"memory_content": "\\u001b[2J' in shown.out  # the body, JSON-escaped as JSON prints it
    assert "\\x9b31m\\u202e" in shown.out  # what JSON leaves raw is escaped too

    as_json = await cli("list", "--json", url=broker.url)
    assert as_json.code == 0
    [letter] = [json.loads(line) for line in as_json.out.splitlines()]
    assert (letter["event_id"], letter["error"]) == (event_id, f"boom{EVIL}")  # the text, JSON-escaped


async def test_show_prints_a_body_nested_ten_thousand_deep(broker: Broker) -> None:  # noqa: F811
    """Before: RecursionError, exit 1 (which means "no such dead letter")."""
    event_id = str(uuid.uuid4())
    body = b'{"event_id": "' + event_id.encode() + b'", "deep": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    await dead_letter_copy(
        broker,
        shard_message(body, event_id=event_id),
        MAIN_KEY,
        kind="schema",
        error="nested too deep",
        attempts=1,
        failed_at=datetime.now(UTC),
    )
    await broker.wait_depth("ltm.create_memory.dlq", 1)

    shown = await cli("show", event_id, url=broker.url)

    assert shown.code == 0, shown.err
    assert "Traceback" not in shown.err
    assert (
        f"body ({len(body)} bytes, nested 10001 levels deep: shown as received, not indented):" in shown.out
    )
    assert shown.out.rstrip("\n").endswith("]" * 10_000 + "}")
    listed = await cli("list", "--event-id", event_id, url=broker.url)
    assert (listed.code, len(listed.out.splitlines())) == (0, 2)


async def test_a_shallow_json_header_is_still_indented(broker: Broker) -> None:  # noqa: F811
    event_id = str(uuid.uuid4())
    message = shard_message({"event_id": event_id, "shard_id": 1}, event_id=event_id)
    message.headers = {"x-table": {"a": 1, "b": ["c"]}}
    message.delivery_mode = aio_pika.DeliveryMode.PERSISTENT
    await dead_letter_copy(
        broker, message, MAIN_KEY, kind="schema", error="x", attempts=1, failed_at=datetime.now(UTC)
    )
    await broker.wait_depth("ltm.create_memory.dlq", 1)

    shown = await cli("show", event_id, url=broker.url)

    assert shown.code == 0, shown.err
    assert '  x-table: {\n    "a": 1,\n    "b": [\n      "c"\n    ]\n  }' in shown.out
    assert f'  "event_id": "{event_id}",' in shown.out
