"""``worker dlq``'s groups and the failure result a shard got, rebuilt: pure, no broker."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from contracts.models import DeadLetterKind
from worker.broker.dead_letters import Letter
from worker.ops.dlq.answer import shard_answer
from worker.ops.dlq.groups import Grouping
from worker.ops.dlq.kinds import WORKER_KINDS, advice, replay_helps, replay_note
from worker.ops.dlq.selection import Selection, group_value, normalise_error, parse_group

NOW = datetime(2026, 12, 4, tzinfo=UTC)


def letter(kind: str, error: str, shard: int | None, minutes: int, event_id: str | None = None) -> Letter:
    return Letter(
        event_id=event_id or str(uuid.uuid4()),
        kind=kind,
        error=error,
        attempts=1,
        failed_at=NOW - timedelta(minutes=minutes),
        shard_id=shard,
        routing_key="tool.create_long_term_memory",
    )


def test_groups_count_and_keep_the_first_sample() -> None:
    letters = [
        letter("schema", "unknown schema_version 2", 3, 10, "first"),
        letter("schema", "unknown schema_version 9", 4, 30),
        letter("internal", "KeyError: 'persona'", None, 5),
    ]
    (schema, internal) = Grouping("kind").extend(letters).groups
    assert (schema.value, schema.count, schema.sample_event_id) == ("schema", 2, "first")
    assert (schema.oldest, schema.newest) == (NOW - timedelta(minutes=30), NOW - timedelta(minutes=10))
    assert internal.count == 1
    (errors, keyerror) = Grouping("error").extend(letters).groups
    assert (errors.value, errors.count) == ("unknown schema_version <n>", 2)
    assert keyerror.replay_command() == "worker dlq replay --group 'error=KeyError: '\"'\"'persona'\"'\"''"
    assert [g.value for g in Grouping("shard").extend(letters).groups] == ["3", "4", "none"]
    assert group_value(letters[2], "shard") == "none"


def test_a_group_is_a_filter() -> None:
    a = letter("schema", "unknown schema_version 2", 3, 10)
    b = letter("schema", "unknown schema_version 2", 4, 10)
    both_shards = Selection(groups=frozenset({("shard", "3"), ("shard", "4")}))
    assert both_shards.matches(a, NOW)
    assert both_shards.matches(b, NOW)
    shard_and_kind = Selection(groups=frozenset({("shard", "3"), ("kind", "schema")}))
    assert shard_and_kind.matches(a, NOW)
    assert not shard_and_kind.matches(b, NOW)
    assert parse_group("error=a=b <n>") == ("error", "a=b <n>")
    for bad in ("kind", "colour=red", "=x"):
        with pytest.raises(ValueError, match="not a group"):
            parse_group(bad)


def body(**fields: object) -> bytes:
    return orjson.dumps(
        {
            "event_id": str(uuid.uuid4()),
            "tool_call_id": "call_1",
            "shard_id": 5,
            "tool_name": "create_long_term_memory",
        }
        | fields
    )


def test_the_failure_result_a_shard_got() -> None:
    sent = body()
    conflict = shard_answer(letter("event_conflict", "x", 5, 1), sent)
    assert conflict.result is not None
    assert conflict.result["status"] == "memory_save_failed_internal_error"
    assert conflict.result["data"]["reason"].startswith("event_id conflict")
    assert conflict.note.startswith("sent to shard.5 on tomori.tool_results;")
    exhausted = shard_answer(letter("transient_exhausted", "x", 5, 1), sent)
    assert exhausted.result is not None
    assert exhausted.result["status"] == "memory_save_failed_db_error"
    assert "unless the event's outcome had committed" in exhausted.note
    assert shard_answer(letter("schema", "x", 5, 1), sent).result is not None
    # no result: the broker's own dead letter, a malformed body, ids that cannot be read
    assert shard_answer(letter("delivery_limit", "x", 5, 1), sent).result is None
    assert shard_answer(letter("malformed", "x", None, 1), b"\xff not json").result is None
    assert shard_answer(letter("schema", "x", 5, 1), body(event_id="not-a-uuid")).result is None


@pytest.mark.parametrize(
    ("error", "group"),
    [
        # newcomer review F11: names and fixed formats keep their digits
        ("not UTF-8 JSON: invalid literal at line 1", "not UTF-8 JSON: invalid literal at line <n>"),
        (
            "event_id: must be a lower-case UUID with hyphens (8-4-4-4-12), as crypto.randomUUID() writes it",
            "event_id: must be a lower-case UUID with hyphens (8-4-4-4-12), as crypto.randomUUID() writes it",
        ),
        ("sha256 mismatch in v1.2", "sha256 mismatch in v1.2"),
        # what varies from letter to letter is a number standing alone, with its sign, dots and unit
        ("unknown schema_version 2", "unknown schema_version <n>"),
        (
            "database unavailable: connection to 10.0.0.5:5432 refused",
            "database unavailable: connection to <n>:<n> refused",
        ),
        ("timed out after 30.5s", "timed out after <n>s"),
        ("value -5 is out of range", "value <n> is out of range"),
        # a bound the worker's own sentence states is the rule, not the case
        (
            "body of 300000 bytes is over the 262144 byte limit",
            "body of <n> bytes is over the 262144 byte limit",
        ),
        ("context.participants: 120000 items, at most 100", "context.participants: <n> items, at most 100"),
        (
            "arguments are nested more than 1024 levels deep",
            "arguments are nested more than 1024 levels deep",
        ),
        ("event 6f1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f and deadbeef0042", "event <id> and <id>"),
    ],
)
def test_error_groups_replace_only_what_varies(error: str, group: str) -> None:
    assert normalise_error(error) == group


def test_each_kind_says_whether_a_replay_can_help() -> None:
    for kind in ("malformed", "schema", "event_conflict", "unverified_shard"):
        assert not replay_helps(kind), kind
        assert replay_note(kind).startswith("a replay fails again: "), kind
    for kind in ("transient_exhausted", "internal", "shard_backlog_full", "delivery_limit", "expired"):
        assert replay_helps(kind), kind
        assert not replay_note(kind).startswith("a replay fails again"), kind
    # a kind this tool does not know (a newer worker's): shown as it is, a replay offered, neutral words
    assert replay_helps("something_new")
    assert "a kind this tool does not know" in advice("something_new").hint
    # the kinds the worker writes today are all in the table
    assert {kind.value for kind in DeadLetterKind} <= set(WORKER_KINDS)


def test_a_group_offers_the_replay_only_for_what_it_can_help() -> None:
    same_error = "database unavailable"
    kinds = (
        Grouping("kind")
        .extend([letter("schema", "x", 3, 1), letter("transient_exhausted", same_error, 3, 1)])
        .groups
    )
    by_kind = {g.value: g for g in kinds}
    assert by_kind["schema"].replay_helps == "no"
    assert by_kind["schema"].useful_replay() is None
    assert by_kind["schema"].hint().startswith("a replay fails again: the event breaks the contract")
    assert by_kind["transient_exhausted"].replay_helps == "yes"
    assert (
        by_kind["transient_exhausted"].useful_replay() == "worker dlq replay --group kind=transient_exhausted"
    )
    (mixed,) = (
        Grouping("shard")
        .extend([letter("schema", "x", 3, 1), letter("transient_exhausted", same_error, 3, 1)])
        .groups
    )
    assert mixed.replay_helps == "some"
    assert mixed.useful_replay() == "worker dlq replay --group shard=3 --kind transient_exhausted"
    assert mixed.as_json()["replay_helps"] == "some"
    assert mixed.as_json()["replay"] == "worker dlq replay --group shard=3"  # the group's own, as before
