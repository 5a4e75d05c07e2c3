"""Reading a delivery's body (worker/broker/envelope.py): the envelope's bounds checked before the models,
the tolerant second reading of what orjson refuses, and the ids a failure result can carry back."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from contracts.models import (
    MAX_ALIASES,
    MAX_BODY_BYTES,
    MAX_DISCORD_NAME,
    MAX_GUILD_MEMBERS,
    MAX_INT4,
    MAX_LABEL,
    MAX_PARTICIPANTS,
    MAX_TARGET_ID,
    MAX_TOOL_CALL_ID_BYTES,
    MAX_WEBHOOK_USERNAME,
    DeadLetterKind,
    ToolCallEvent,
)
from contracts.schemas import json_schemas
from tests.factories import event_body, member, participant
from worker.broker.envelope import ORJSON_MAX_DEPTH, Unreadable, envelope_problem, read_event
from worker.pipeline.arguments import UnreadableArguments, validate_arguments

ARGUMENTS = {"memory_content": "{user} likes dogs", "memory_scope": "server_wide"}


def body(**context: Any) -> dict[str, Any]:
    data = event_body(ARGUMENTS, persona_id=7)
    data["context"].update(context)
    return data


def dumped(data: dict[str, Any]) -> bytes:
    return orjson.dumps(data)


def with_raw(data: dict[str, Any], placeholder: str, raw: bytes) -> bytes:
    """``data`` as JSON, the string ``placeholder`` replaced by ``raw`` JSON text (orjson may refuse it)."""
    text = orjson.dumps(data)
    marker = orjson.dumps(placeholder)
    assert text.count(marker) == 1
    return text.replace(marker, raw)


def refused(read: object, kind: DeadLetterKind = DeadLetterKind.SCHEMA) -> Unreadable:
    assert isinstance(read, Unreadable), read
    assert read.kind == kind, read
    return read


# --- bounds: each list and string of the envelope, refused before the models with the field named -----------


def test_a_valid_event_is_read() -> None:
    assert isinstance(read_event(dumped(body())), ToolCallEvent)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        pytest.param(
            {"participants": [0] * 120_000}, "context.participants: 120000 items", id="participants"
        ),
        pytest.param({"guild_members": [0] * 100_000}, "context.guild_members: 100000 items", id="members"),
        pytest.param(
            {"participants": [participant("1150000000000000201", "x", ["a"] * (MAX_ALIASES + 1))]},
            f"context.participants.0.aliases: {MAX_ALIASES + 1} items",
            id="aliases",
        ),
        pytest.param(
            {"guild_members": [member("1150000000000000201", "u" * (MAX_DISCORD_NAME + 1))]},
            "context.guild_members.0.username: 33 characters, at most 32",
            id="username",
        ),
        pytest.param(
            {"guild_members": [member("1150000000000000201", "u", global_name="g" * 200_000)]},
            "context.guild_members.0.global_name: 200000 characters, at most 32",
            id="global name",
        ),
        pytest.param(
            {"guild_members": [member("1150000000000000201", "u", nickname="n" * 33)]},
            "context.guild_members.0.nickname: 33 characters",
            id="nickname",
        ),
        pytest.param(
            {"participants": [participant("1150000000000000201", "l" * (MAX_LABEL + 1), [])]},
            "context.participants.0.display_label: 257 characters",
            id="display label",
        ),
        pytest.param(
            {"participants": [participant("@" + "m" * MAX_TARGET_ID, "x", [])]},
            "context.participants.0.target_id: 256 characters",
            id="target id",
        ),
        pytest.param(
            {"participants": [participant("1150000000000000201", "x", ["a" * (MAX_LABEL + 1)])]},
            "context.participants.0.aliases.0: 257 characters",
            id="alias",
        ),
        pytest.param(
            {
                "reply_via": {
                    "webhook_disc_id": "1150000000000000300",
                    "username": "w" * (MAX_WEBHOOK_USERNAME + 1),
                }
            },
            "context.reply_via.username: 81 characters",
            id="webhook username",
        ),
        pytest.param(
            {"guild_members": [{"user_disc_id": "1150000000000000201", "username": "a\x00b"}]},
            "context.guild_members.0.username: holds U+0000",
            id="NUL in a name",
        ),
        pytest.param(
            {"participants": [participant("1150000000000000201", "x", ["\x00"])]},
            "context.participants.0.aliases.0: holds U+0000",
            id="NUL in an alias",
        ),
        pytest.param({"guild_members": [{}] * 3}, "context.guild_members.0.user_disc_id", id="empty member"),
        pytest.param(
            {"participants": [{}] * 3}, "context.participants.0.target_id: missing", id="empty participant"
        ),
        pytest.param(
            {"participants": [{"target_id": "1", "display_label": "x", "aliases": [1] * 20}]},
            "context.participants.0.aliases.0: not a string",
            id="alias not a string",
        ),
        pytest.param(
            {"guild_members": [{"user_disc_id": "1150000000000000201", "username": "u", "is_bot": 1}]},
            "context.guild_members.0.is_bot: not a boolean",
            id="is_bot not a boolean",
        ),
    ],
)
def test_an_over_bound_or_broken_list_item_is_a_schema_dead_letter_naming_the_field(
    change: dict[str, Any], field: str
) -> None:
    read = refused(read_event(dumped(body(**change))))
    assert read.error.startswith("envelope breaks the contract: ")
    assert field in read.error
    assert read.ids is not None  # the shard is still answered


def test_the_bounds_check_agrees_with_the_models() -> None:
    """What the check lets through, the models judge; what it refuses, the models refuse too."""
    cases = [
        body(
            participants=[
                participant("1150000000000000201", "l" * MAX_LABEL, ["a" * MAX_LABEL] * MAX_ALIASES)
            ]
        ),
        body(guild_members=[member("1150000000000000201", "u" * 32, "g" * 32, "n" * 32)] * MAX_GUILD_MEMBERS),
        body(participants=[participant("1150000000000000201", "x", [])] * MAX_PARTICIPANTS),
        body(participants=[participant("1150000000000000201", "x", [])] * (MAX_PARTICIPANTS + 1)),
        body(guild_members=[member("1150000000000000201", "u" * 33)]),
        body(participants=[participant("1150000000000000201", "x", ["a\x00"])]),
        {**body(), "tool_call_id": "é" * 128},  # 256 bytes
        {**body(), "tool_call_id": "é" * 127},  # 254 bytes
    ]
    for data in cases:
        problem = envelope_problem(copy.deepcopy(data))
        try:
            ToolCallEvent.model_validate(data)
        except ValidationError:
            assert problem is not None
        else:
            assert problem is None


def test_a_tool_call_id_must_fit_the_amqp_short_string_in_bytes() -> None:
    at_limit = "é" * (MAX_TOOL_CALL_ID_BYTES // 2) + "x"  # 255 bytes, 128 characters
    assert isinstance(read_event(dumped({**body(), "tool_call_id": at_limit})), ToolCallEvent)
    read = refused(read_event(dumped({**body(), "tool_call_id": "é" * 128})))
    assert "tool_call_id: more than 255 bytes" in read.error
    assert read.ids is None  # a result could not carry it back
    read = refused(read_event(dumped({**body(), "tool_call_id": "c" * 300})))
    assert "tool_call_id: 300 characters, at most 255" in read.error
    assert read.ids is None


def test_nul_in_the_tool_call_id_is_a_schema_error_still_answered() -> None:
    read = refused(read_event(dumped({**body(), "tool_call_id": "call\x00x"})))
    assert "tool_call_id: holds U+0000" in read.error
    assert read.ids is not None
    assert read.ids.tool_call_id == "call\x00x"


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("shard_id", 2**31),
        ("shard_id", 2**63),
        ("shard_id", 2**64 - 1),
        ("persona_id", 2**31),
        ("persona_id", -1),
    ],
)
def test_integers_beyond_their_int4_columns_are_schema_errors(where: str, value: int) -> None:
    data = body()
    if where == "shard_id":
        data["shard_id"] = value
    else:
        data["context"]["persona_id"] = value
    read = refused(read_event(dumped(data)))
    assert where in read.error
    # answered when the shard can be routed to
    assert (read.ids is not None) == (where == "persona_id")


def test_the_largest_ids_still_fit() -> None:
    data = body()
    data["shard_id"] = MAX_INT4
    data["context"]["persona_id"] = MAX_INT4
    event = read_event(dumped(data))
    assert isinstance(event, ToolCallEvent)
    assert (event.shard_id, event.context.persona_id) == (MAX_INT4, MAX_INT4)


def test_the_json_schema_carries_every_bound() -> None:
    schema = json_schemas()["tool_call_event.v1.json"]
    defs = schema["$defs"]
    context = defs["EventContext"]["properties"]
    assert context["guild_members"]["maxItems"] == MAX_GUILD_MEMBERS
    assert context["participants"]["maxItems"] == MAX_PARTICIPANTS
    assert context["persona_id"]["maximum"] == MAX_INT4
    assert defs["Participant"]["properties"]["aliases"]["maxItems"] == MAX_ALIASES
    assert defs["Participant"]["properties"]["aliases"]["items"]["maxLength"] == MAX_LABEL
    assert defs["Participant"]["properties"]["display_label"]["maxLength"] == MAX_LABEL
    assert defs["Participant"]["properties"]["target_id"]["maxLength"] == MAX_TARGET_ID
    for name in ("username", "global_name", "nickname"):
        text = defs["GuildMember"]["properties"][name]
        assert MAX_DISCORD_NAME in [
            text.get("maxLength"),
            *(b.get("maxLength") for b in text.get("anyOf", [])),
        ]
    assert defs["ReplyVia"]["properties"]["username"]["maxLength"] == MAX_WEBHOOK_USERNAME
    top = schema["properties"]
    assert top["tool_call_id"]["maxLength"] == MAX_TOOL_CALL_ID_BYTES
    assert top["shard_id"]["maximum"] == MAX_INT4
    assert top["event_id"]["maxLength"] == 36
    assert top["issued_at"]["maxLength"] == 64


# --- event_id and message_id: what the shard gets back is what it sent -------------------------------------


@pytest.mark.parametrize(
    "form",
    [str.upper, lambda s: s.replace("-", ""), lambda s: "{" + s + "}", lambda s: "urn:uuid:" + s],
    ids=["upper case", "no hyphens", "braces", "urn"],
)
def test_an_event_id_not_in_the_canonical_form_is_refused_unanswered(form: Any) -> None:
    data = body()
    data["event_id"] = form(data["event_id"])
    read = refused(read_event(dumped(data)))
    assert "event_id" in read.error
    assert "lower-case UUID with hyphens" in read.error
    assert read.ids is None  # an answer with another spelling could not be matched by the shard


def test_the_message_id_must_be_the_event_id() -> None:
    data = body()
    assert isinstance(read_event(dumped(data), message_id=data["event_id"]), ToolCallEvent)
    assert isinstance(read_event(dumped(data), message_id=None), ToolCallEvent)
    other = str(uuid.uuid4())
    read = refused(read_event(dumped(data), message_id=other))
    assert f"message_id '{other}' is not the body's event_id {data['event_id']}" in read.error
    assert read.ids is not None
    assert str(read.ids.event_id) == data["event_id"]
    # what is not a canonical UUID is not read as an event id: aiormq makes up 32 hex digits for a publish
    # without a message_id, and the worker's retry copy of such an event goes out that way
    assert isinstance(read_event(dumped(data), message_id=uuid.uuid4().hex), ToolCallEvent)
    assert isinstance(read_event(dumped(data), message_id="poison"), ToolCallEvent)


# --- the tolerant reading: bad values inside arguments are the pipeline's to answer ------------------------


@pytest.mark.parametrize(
    ("raw", "sentence"),
    [
        (
            b'{"memory_content": "likes \\ud800 tea", "memory_scope": "server_wide"}',
            "Invalid parameters: Parameter 'memory_content' is not valid Unicode (a lone surrogate)",
        ),
        (
            b'{"memory_content": 1e400, "memory_scope": "server_wide"}',
            "Invalid parameters: Parameter 'memory_content' expected type 'string' but got 'number'",
        ),
        (
            b'{"memory_content": NaN, "memory_scope": "server_wide"}',
            "Invalid parameters: Parameter 'memory_content' expected type 'string' but got 'number'",
        ),
        (
            b'{"memory_content": "x", "memory_scope": "target_user", "target_user": "\\udfff"}',
            "Invalid parameters: Parameter 'target_user' is not valid Unicode (a lone surrogate)",
        ),
        (
            b"[" * 10_000 + b"]" * 10_000,
            f"Invalid parameters: arguments are nested more than {ORJSON_MAX_DEPTH} levels deep",
        ),
        (
            b'{"memory_content": "x", "memory_scope": "server_wide", "deep": '
            + b"[" * 2000
            + b"]" * 2000
            + b"}",
            f"Invalid parameters: arguments are nested more than {ORJSON_MAX_DEPTH} levels deep",
        ),
    ],
    ids=["lone surrogate", "1e400", "NaN", "target surrogate", "10,000 deep", "deep unknown key"],
)
def test_values_orjson_refuses_inside_arguments_are_read_and_answered_as_invalid(
    raw: bytes, sentence: str
) -> None:
    event = read_event(with_raw(event_body("@args", persona_id=7), "@args", raw))
    assert isinstance(event, ToolCallEvent), event
    assert validate_arguments(event.arguments) == sentence


def test_nul_inside_arguments_is_answered_as_invalid_arguments() -> None:
    event = read_event(
        dumped(event_body({"memory_content": "a\x00b", "memory_scope": "server_wide"}, persona_id=7))
    )
    assert isinstance(event, ToolCallEvent)
    assert validate_arguments(event.arguments) == (
        "Invalid parameters: Parameter 'memory_content' must not contain NUL characters"
    )


def test_an_unknown_argument_orjson_refuses_is_ignored_like_any_unknown_argument() -> None:
    raw = (
        b'{"memory_content": "likes tea", "memory_scope": "server_wide", "weight": 1e400, "note": "\\ud800"}'
    )
    event = read_event(with_raw(event_body("@args", persona_id=7), "@args", raw))
    assert isinstance(event, ToolCallEvent)
    args = validate_arguments(event.arguments)
    assert not isinstance(args, str)
    assert args.content == "likes tea"


@pytest.mark.parametrize("arguments_last", [False, True], ids=["arguments before context", "arguments last"])
def test_deep_arguments_are_read_around_whatever_the_key_order(arguments_last: bool) -> None:
    data = event_body("@args", persona_id=7)
    if arguments_last:
        data["arguments"] = data.pop("arguments")
    deep = b"[" * 50_000 + b"]" * 50_000
    event = read_event(with_raw(data, "@args", deep))
    assert isinstance(event, ToolCallEvent)
    assert isinstance(event.arguments, UnreadableArguments)
    assert event.event_id == uuid.UUID(data["event_id"])
    assert event.context.persona_id == 7


def test_envelope_keys_planted_inside_deep_arguments_do_not_fool_the_reading() -> None:
    data = event_body("@args", persona_id=7)
    planted = b',"context":{"persona_id":1},"event_id":"x","shard_id":9'
    deep = b"[" * 1100 + b"{" + planted[1:] + b"}" + (b"," + b"{" + planted[1:] + b"}") * 10 + b"]" * 1100
    event = read_event(with_raw(data, "@args", deep))
    assert isinstance(event, ToolCallEvent)
    assert (event.shard_id, event.context.persona_id) == (3, 7)


def test_deep_nesting_outside_arguments_is_malformed() -> None:
    data = {"extra": "@deep", **event_body(ARGUMENTS, persona_id=7)}  # before the arguments key
    read = refused(read_event(with_raw(data, "@deep", b"[" * 5000 + b"]" * 5000)), DeadLetterKind.MALFORMED)
    assert f"nested deeper than {ORJSON_MAX_DEPTH} levels outside the top-level arguments" in read.error


def test_deep_nesting_in_the_context_is_refused_and_says_how_it_was_read() -> None:
    data = event_body(ARGUMENTS, persona_id=7)
    data["context"]["extra"] = "@deep"
    read = read_event(with_raw(data, "@deep", b"[" * 5000 + b"]" * 5000))
    assert isinstance(read, Unreadable)
    assert "nested over 1024 levels deep" in read.error


@pytest.mark.parametrize(
    ("placeholder_at", "raw", "field"),
    [
        ("persona_id", b"NaN", "context.persona_id"),
        ("persona_id", b"1e400", "context.persona_id"),
        ("guild_disc_id", b'"\\ud800"', "context.guild_disc_id"),
    ],
)
def test_values_orjson_refuses_in_the_envelope_are_schema_errors_still_answered(
    placeholder_at: str, raw: bytes, field: str
) -> None:
    data = event_body(ARGUMENTS, persona_id=7)
    data["context"][placeholder_at] = "@bad"
    read = refused(read_event(with_raw(data, "@bad", raw)))
    assert field in read.error
    assert read.ids is not None


def test_a_lone_surrogate_in_the_tool_call_id_cannot_be_answered() -> None:
    data = event_body(ARGUMENTS, persona_id=7)
    data["tool_call_id"] = "@bad"
    read = refused(read_event(with_raw(data, "@bad", b'"call\\ud800"')))
    assert "tool_call_id: holds a lone surrogate" in read.error
    assert read.ids is None
    read.error.encode("utf-8")  # the header value is UTF-8


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b'{"a": "\xff\xfe"}', "not UTF-8 JSON: not UTF-8 (byte 0xff at offset 7)"),
        (b"\x1b[31mred\x1b[0m \xff\xfe", "not UTF-8 (byte 0xff at offset 13)"),  # newcomer review 5, N9
        (b'{"a": 1,}', "not UTF-8 JSON"),
        (b"[1, 2]", "JSON list is not an object"),
        (b"null", "JSON null is not an object"),
        (b'{"a": ' + b"1" * 5000 + b"}", "not UTF-8 JSON"),  # beyond orjson and Python's 4300 digits
    ],
)
def test_what_is_not_json_stays_malformed(raw: bytes, why: str) -> None:
    assert why in refused(read_event(raw), DeadLetterKind.MALFORMED).error


def test_a_body_over_the_limit_is_not_read() -> None:
    data = body()
    data["pad"] = "x" * MAX_BODY_BYTES
    read = refused(read_event(dumped(data)))
    assert "byte limit" in read.error
    assert read.ids is None


def test_what_passes_the_bounds_check_gives_pydantic_only_a_handful_of_errors() -> None:
    """Every scalar of the envelope wrong at once, the lists within bounds: a few dozen errors at most, where
    an unchecked list used to make pydantic build one per item (120,000 for the review's body)."""
    data = body(guild_members=[member("1150000000000000201", "u")] * MAX_GUILD_MEMBERS)
    data.update(schema_version="1", event_id=1, tool_name=2, issued_at="yesterday", shard_id="4")
    data["context"].update(
        guild_disc_id=1,
        channel_disc_id=2,
        thread_id=3,
        triggering_user_disc_id=4,
        bot_user_disc_id=5,
        persona_id="x",
    )
    data["context"]["reply_via"] = {"webhook_disc_id": 1, "username": 2, "avatar_url": 3}
    assert envelope_problem(data) is not None  # reply_via.username is not a string: named before pydantic
    del data["context"]["reply_via"]
    assert envelope_problem(data) is None
    with pytest.raises(ValidationError) as raised:
        ToolCallEvent.model_validate(data)
    assert raised.value.error_count() <= 20
    read = refused(read_event(dumped(data)))
    assert "(+" in read.error  # five named, the count of the rest given
