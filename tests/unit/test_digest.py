"""The event digest the ledger answers by: what it covers, what it ignores, and the legacy-row rule."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from contracts.models import ToolCallEvent
from tests.factories import event_body, member
from worker.service.digest import event_digest, same_event


def parsed(body: dict[str, Any]) -> ToolCallEvent:
    return ToolCallEvent.model_validate_json(json.dumps(body))


BODY = event_body(
    {"memory_content": "{user} likes dogs", "memory_scope": "server_wide", "extra": [1, 2.5, None]},
    persona_id=7,
    members=[member("1150000000000000201", "sparrow_ow", "Sparrow")],
)


def test_the_same_bytes_give_the_same_digest() -> None:
    assert event_digest(parsed(BODY)) == event_digest(parsed(copy.deepcopy(BODY)))
    assert len(event_digest(parsed(BODY))) == 32


def test_what_a_resend_may_change_is_not_covered() -> None:
    """Key order, spacing, the send time and the shard's view of the guild do not make another event."""
    body = copy.deepcopy(BODY)
    body["issued_at"] = "2026-12-02T09:30:00+01:00"
    body["context"]["guild_members"] = []
    body["context"]["participants"] = [
        {"target_id": "@a:matrix.org", "display_label": "A", "aliases": [], "is_bridge": True}
    ]
    body["arguments"] = dict(reversed(list(body["arguments"].items())))
    text = json.dumps(body, indent=2, sort_keys=True)
    assert event_digest(ToolCallEvent.model_validate_json(text)) == event_digest(parsed(BODY))


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("tool_call_id",), "call_other"),
        (("tool_name",), "remember_this_fact"),
        (("shard_id",), 5),
        (("context", "guild_disc_id"), "1150000000000000002"),
        (("context", "guild_disc_id"), None),
        (("context", "channel_disc_id"), "1150000000000000101"),
        (("context", "thread_id"), "1150000000000000102"),
        (("context", "triggering_user_disc_id"), "1150000000000000203"),
        (("context", "bot_user_disc_id"), "1150000000000000998"),
        (("context", "persona_id"), 8),
        (
            ("context", "reply_via"),
            {"webhook_disc_id": "1150000000000000777", "username": "Alter", "avatar_url": None},
        ),
        (("arguments", "memory_content"), "{user} likes cats"),
        (("arguments", "memory_scope"), "target_user"),
        (("arguments", "extra"), [1, 2.5]),
        (("arguments",), None),
        (("arguments",), "a string"),
    ],
)
def test_every_covered_field_changes_the_digest(path: tuple[str, ...], value: Any) -> None:
    body = copy.deepcopy(BODY)
    where = body
    for key in path[:-1]:
        where = where[key]
    where[path[-1]] = value
    assert event_digest(parsed(body)) != event_digest(parsed(BODY))


def stored_row(event: ToolCallEvent, *, digest: bytes | None, notice: Any = None) -> dict[str, Any]:
    return {
        "digest": digest.hex() if digest is not None else None,
        "tool_call_id": event.tool_call_id,
        "tool_name": event.tool_name,
        "shard_id": event.shard_id,
        "notice": notice,
    }


def test_a_row_with_a_digest_matches_only_that_digest() -> None:
    event = parsed(BODY)
    other = parsed({**BODY, "arguments": {"memory_content": "x", "memory_scope": "server_wide"}})
    row = stored_row(event, digest=event_digest(event))
    assert same_event(row, event, event_digest(event))
    # the same tool call id, shard and scope with other arguments is another event
    assert not same_event(row, other, event_digest(other))


def test_a_legacy_row_matches_its_tool_call_shard_and_notice_scope() -> None:
    event = parsed(BODY)
    ctx = event.context
    notice = {"guild_disc_id": ctx.guild_disc_id, "channel_disc_id": ctx.channel_disc_id, "thread_id": None}
    digest = event_digest(event)
    assert same_event(stored_row(event, digest=None, notice=notice), event, digest)
    assert same_event(stored_row(event, digest=None), event, digest)  # a failure: no notice to compare
    for change in ({"tool_call_id": "call_x"}, {"tool_name": "remember_this_fact"}, {"shard_id": 5}):
        assert not same_event({**stored_row(event, digest=None, notice=notice), **change}, event, digest)
    for key in ("guild_disc_id", "channel_disc_id", "thread_id"):
        moved = {**notice, key: "1150000000000000009"}
        assert not same_event(stored_row(event, digest=None, notice=moved), event, digest)


@pytest.mark.parametrize(
    "arguments",
    [
        {"memory_content": "\ud800 lone", "memory_scope": "server_wide"},
        "deep",
    ],
)
def test_arguments_orjson_cannot_write_still_have_a_stable_digest(arguments: Any) -> None:
    """Found when the envelope learnt to read such arguments (to answer them as invalid): the digest must
    not raise on what the pipeline answers."""
    if arguments == "deep":
        value: Any = "x"
        for _ in range(600):  # orjson reads 1024 levels but writes 255
            value = [value]
        arguments = {"memory_content": value}
    first = event_digest(ToolCallEvent.model_validate({**BODY, "arguments": arguments}))
    assert first == event_digest(ToolCallEvent.model_validate({**BODY, "arguments": arguments}))
    assert len(first) == 32
