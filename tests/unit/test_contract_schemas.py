"""The wire models against CONTRACT.md, and the committed JSON Schema files against the models."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from jsonschema import Draft202012Validator
from pydantic import TypeAdapter, ValidationError

from contracts.example import EXAMPLE_EVENT
from contracts.models import (
    RESULT_DATA,
    CacheInvalidation,
    DeadLetterHeaders,
    DeadLetterKind,
    Notification,
    ServerStateInvalidation,
    Status,
    ToolCallEvent,
    ToolResult,
    UserInvalidation,
    invalidation_id,
)
from contracts.schemas import (
    REGENERATE_COMMAND,
    SCHEMA_DIR,
    contract_files,
    json_schemas,
    main,
    stale_files,
    write_files,
)
from tests.schemas import assert_conforms, errors

# The example body of CONTRACT.md "Tool-call event" (shipped: worker demo sends a copy of it).
CONTRACT_EVENT: dict[str, Any] = EXAMPLE_EVENT

EVENT_ID = "6f1c1a9e-3b0e-4a53-9a55-6a4f0f0b9a11"
INVALIDATION_ID = invalidation_id(UUID(EVENT_ID))

Validate = Callable[[dict[str, Any]], ToolCallEvent]


def _from_json(body: dict[str, Any]) -> ToolCallEvent:
    return ToolCallEvent.model_validate_json(json.dumps(body))


def _from_python(body: dict[str, Any]) -> ToolCallEvent:
    return ToolCallEvent.model_validate(body)


# The consumer may validate the raw bytes or a dict parsed by orjson: both must be equally strict.
validators = pytest.mark.parametrize("validate", [_from_json, _from_python], ids=["json", "python"])


def event(**changes: Any) -> dict[str, Any]:
    body = copy.deepcopy(CONTRACT_EVENT)
    body.update(changes)
    return body


# --- the committed schema files ---------------------------------------------------------------------


def test_committed_schema_files_match_the_models() -> None:
    stale = stale_files()
    assert not stale, (
        f"contracts/schemas/ is out of date for {', '.join(stale)}: run `{REGENERATE_COMMAND}` and commit"
    )


def test_check_mode_passes_on_the_committed_files() -> None:
    assert main(["--check"]) == 0


def test_every_contract_message_has_a_schema_with_id_title_and_description() -> None:
    schemas = json_schemas()

    assert set(schemas) == {
        "tool_call_event.v1.json",
        "tool_result.v1.json",
        "notification.v1.json",
        "cache_invalidation.v1.json",
        "dead_letter_headers.v1.json",
        "create_memory_arguments.v1.json",
    }
    for name, schema in schemas.items():
        assert schema["$id"].endswith(name.removesuffix(".json")), name
        assert schema["title"], name
        assert schema["description"], name
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schemas["tool_call_event.v1.json"]["description"].startswith("Shard -> worker")
    assert "x-ltm-error-kind" in schemas["dead_letter_headers.v1.json"]["properties"]


def result_branches() -> list[dict[str, Any]]:
    """The tool result's ``oneOf`` branches, one per status, in the order of :data:`Status`."""
    schema = json_schemas()["tool_result.v1.json"]
    return [schema["$defs"][ref["$ref"].removeprefix("#/$defs/")] for ref in schema["oneOf"]]


def test_outbound_schemas_require_every_field_the_worker_writes() -> None:
    for branch in result_branches():
        assert set(branch["required"]) == set(branch["properties"]) == set(ToolResult.model_fields)
    notification = json_schemas()["notification.v1.json"]
    assert set(notification["required"]) == set(notification["properties"])


def test_check_names_missing_changed_and_extra_files(tmp_path: Path) -> None:
    assert stale_files(tmp_path) == sorted(contract_files())

    write_files(tmp_path)
    assert stale_files(tmp_path) == []

    (tmp_path / "notification.v1.json").write_text("{}\n", encoding="utf-8")
    (tmp_path / "old.v0.json").write_text("{}\n", encoding="utf-8")
    assert stale_files(tmp_path) == ["notification.v1.json", "old.v0.json"]

    write_files(tmp_path)
    assert stale_files(tmp_path) == []
    assert not (tmp_path / "old.v0.json").exists()


def test_files_are_pretty_sorted_and_newline_terminated(tmp_path: Path) -> None:
    write_files(tmp_path)
    text = (tmp_path / "tool_call_event.v1.json").read_text(encoding="utf-8")

    assert text.endswith("}\n")
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


# --- the tool-call event ----------------------------------------------------------------------------


@validators
def test_the_contract_example_validates(validate: Validate) -> None:
    parsed = validate(CONTRACT_EVENT)

    assert str(parsed.event_id) == EVENT_ID
    assert parsed.shard_id == 3
    assert parsed.context.guild_disc_id == "1150000000000000001"
    assert parsed.context.participants[1].is_bridge
    assert parsed.context.guild_members[0].username == "sparrow_ow"
    assert parsed.arguments == CONTRACT_EVENT["arguments"]


@validators
def test_the_alias_tool_name_is_accepted(validate: Validate) -> None:
    assert validate(event(tool_name="remember_this_fact")).tool_name == "remember_this_fact"


@validators
@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"shard_id": "3"}, id="string shard_id"),
        pytest.param({"shard_id": -1}, id="negative shard_id"),
        pytest.param({"shard_id": 3.0}, id="float shard_id"),
        pytest.param({"shard_id": True}, id="boolean shard_id"),
        pytest.param({"event_id": "not-a-uuid"}, id="non-UUID event_id"),
        pytest.param({"event_id": 42}, id="numeric event_id"),
        pytest.param({"schema_version": 2}, id="unknown schema_version"),
        pytest.param({"schema_version": "1"}, id="string schema_version"),
        pytest.param({"schema_version": True}, id="boolean schema_version"),
        pytest.param({"schema_version": 1.0}, id="float schema_version"),
        pytest.param({"tool_name": "forget_everything"}, id="unknown tool_name"),
        pytest.param({"tool_call_id": 8731}, id="numeric tool_call_id"),
        pytest.param({"issued_at": 1796198400}, id="numeric issued_at"),
        pytest.param({"issued_at": "2026-12-02T08:00:00"}, id="issued_at without offset"),
        pytest.param({"context": None}, id="null context"),
        pytest.param({"context": []}, id="array context"),
    ],
)
def test_a_broken_envelope_is_rejected(validate: Validate, changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        validate(event(**changes))


@validators
@pytest.mark.parametrize(
    "field", ["schema_version", "event_id", "tool_call_id", "tool_name", "issued_at", "shard_id", "context"]
)
def test_a_missing_envelope_field_is_rejected(validate: Validate, field: str) -> None:
    body = event()
    del body[field]
    with pytest.raises(ValidationError):
        validate(body)


@validators
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("channel_disc_id", "1234"),
        ("channel_disc_id", 1150000000000000100),
        ("bot_user_disc_id", "115000000000000099x"),
        ("guild_disc_id", "1150000000000000001\n"),
        ("persona_id", "7"),
    ],
)
def test_ill_typed_context_ids_are_rejected(validate: Validate, field: str, value: Any) -> None:
    body = event()
    body["context"][field] = value
    with pytest.raises(ValidationError):
        validate(body)


@validators
def test_more_than_1000_guild_members_are_rejected(validate: Validate) -> None:
    body = event()
    member = body["context"]["guild_members"][0]
    body["context"]["guild_members"] = [member] * 1001
    with pytest.raises(ValidationError):
        validate(body)


@validators
def test_unknown_keys_are_ignored(validate: Validate) -> None:
    body = event(future_field={"x": 1}, priority="high")
    body["context"]["locale"] = "ja"

    assert validate(body) == validate(CONTRACT_EVENT)


@validators
@pytest.mark.parametrize(
    "arguments",
    [{"memory_content": "x"}, {}, ["a", 1], "a string", None, 3, 2.5, True],
    ids=["object", "empty object", "array", "string", "null", "integer", "float", "boolean"],
)
def test_arguments_of_any_json_type_are_accepted(validate: Validate, arguments: Any) -> None:
    assert validate(event(arguments=arguments)).arguments == arguments


@validators
def test_missing_arguments_read_as_null(validate: Validate) -> None:
    body = event()
    del body["arguments"]
    assert validate(body).arguments is None


@validators
def test_a_dm_event_has_no_guild(validate: Validate) -> None:
    body = event()
    body["context"]["guild_disc_id"] = None
    body["context"]["participants"] = []
    body["context"]["guild_members"] = []
    assert validate(body).context.guild_disc_id is None


# --- outbound messages ------------------------------------------------------------------------------


def test_a_result_serialises_with_every_contract_field() -> None:
    result = ToolResult(
        event_id=EVENT_ID,
        tool_call_id="call_8731",
        tool_name="remember_this_fact",
        success=True,
        status="memory_saved_successfully",
        message="Memory saved successfully",
        error=None,
        data={"status": "memory_saved_successfully", "scope": "server_wide", "memory_id": 123},
        processed_at="2026-12-02T08:00:00.120Z",
    )
    dumped = json.loads(result.model_dump_json())

    assert set(dumped) == set(result_branches()[0]["properties"])
    assert dumped["schema_version"] == 1
    assert dumped["event_id"] == EVENT_ID
    assert dumped["replayed"] is False


def test_a_notification_carries_the_notice() -> None:
    notification = Notification.model_validate(
        {
            "event_id": EVENT_ID,
            "guild_disc_id": "1150000000000000001",
            "channel_disc_id": "1150000000000000100",
            "thread_id": None,
            "reply_via": None,
            "notice": {
                "kind": "server_memory",
                "title": "🧠 Tomori Learned Something New!",
                "description": "d",
                "footer": "f",
                "full_content": "c",
                "expandable": False,
            },
        }
    )
    assert notification.notice.accent_color == "#2ECC71"
    assert json.loads(notification.model_dump_json())["schema_version"] == 1


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            {
                "schema_version": 1,
                "invalidation_id": INVALIDATION_ID,
                "kind": "tomori_state",
                "server_disc_id": "1",
            },
            ServerStateInvalidation,
        ),
        (
            {"schema_version": 1, "invalidation_id": INVALIDATION_ID, "kind": "user", "user_disc_id": "2"},
            UserInvalidation,
        ),
    ],
)
def test_cache_invalidation_is_discriminated_by_kind(message: dict[str, Any], expected: type[Any]) -> None:
    adapter: TypeAdapter[ServerStateInvalidation | UserInvalidation] = TypeAdapter(CacheInvalidation)

    parsed = adapter.validate_json(json.dumps(message))

    assert isinstance(parsed, expected)
    assert json.loads(adapter.dump_json(parsed)) == message


def test_cache_invalidation_rejects_an_unknown_kind() -> None:
    with pytest.raises(ValidationError):
        TypeAdapter(CacheInvalidation).validate_python({"invalidation_id": INVALIDATION_ID, "kind": "guild"})


def test_dead_letter_headers_use_the_x_ltm_names() -> None:
    headers = DeadLetterHeaders.model_validate(
        {
            "x-ltm-error": "body is not JSON",
            "x-ltm-error-kind": "malformed",
            "x-ltm-attempts": 1,
            "x-ltm-failed-at": "2026-12-02T08:00:00Z",
        }
    )
    assert set(headers.model_dump(by_alias=True)) == {
        "x-ltm-error",
        "x-ltm-error-kind",
        "x-ltm-attempts",
        "x-ltm-failed-at",
    }


# --- the AsyncAPI document --------------------------------------------------------------------------


def test_asyncapi_document_covers_every_channel_and_points_at_existing_schemas() -> None:
    from contracts.asyncapi import asyncapi_document

    document = asyncapi_document()
    assert document["asyncapi"] == "3.0.0"
    titles = {channel["title"] for channel in document["channels"].values()}
    assert titles == {
        "tomori.tool_calls",
        "tomori.tool_results",
        "tomori.notifications",
        "tomori.dead_letter",
        "Redis pub/sub channel",
    }
    schema_files = set(json_schemas())
    for message in document["components"]["messages"].values():
        for part in ("payload", "headers"):
            ref = message.get(part, {}).get("$ref")
            if ref is not None:
                assert ref in schema_files
    for operation in document["operations"].values():
        channel = operation["channel"]["$ref"].removeprefix("#/channels/")
        assert channel in document["channels"]


# --- the schema files as JSON Schema tools read them ------------------------------------------------
# Node's Ajv (strict), json-schema-to-typescript and @asyncapi/parser run in contracts/typescript's checks;
# these tests hold the properties those tools depend on, and the messages against the files with the
# `jsonschema` package.

SCHEMA_KEYWORDS_ONE = ("additionalProperties", "items", "contains", "not", "if", "then", "else")
SCHEMA_KEYWORDS_MAP = ("properties", "patternProperties", "$defs")
SCHEMA_KEYWORDS_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")


def subschemas(schema: dict[str, Any], where: str = "#") -> list[tuple[str, dict[str, Any]]]:
    """``schema`` and every schema inside it, with a JSON pointer (property names are not keywords)."""
    found = [(where, schema)]
    for key in SCHEMA_KEYWORDS_ONE:
        if isinstance(schema.get(key), dict):
            found += subschemas(schema[key], f"{where}/{key}")
    for key in SCHEMA_KEYWORDS_MAP:
        for name, sub in schema.get(key, {}).items():
            found += subschemas(sub, f"{where}/{key}/{name}")
    for key in SCHEMA_KEYWORDS_LIST:
        for index, sub in enumerate(schema.get(key, [])):
            found += subschemas(sub, f"{where}/{key}/{index}")
    return found


def result_of(outcome: Any, *, event_id: str = EVENT_ID) -> dict[str, Any]:
    from worker.broker.envelope import RoutableIds
    from worker.pipeline.outcome import Outcome

    assert isinstance(outcome, Outcome)
    ids = RoutableIds(UUID(event_id), "call_8731", 0, "create_long_term_memory")
    return outcome.result(ids, datetime(2026, 12, 2, 8, tzinfo=UTC)).model_dump(mode="json")


@pytest.mark.parametrize("name", sorted(json_schemas()))
def test_every_file_is_a_valid_2020_12_schema(name: str) -> None:
    Draft202012Validator.check_schema(json.loads((SCHEMA_DIR / name).read_text(encoding="utf-8")))


@pytest.mark.parametrize("name", sorted(json_schemas()))
def test_no_discriminator_and_titles_only_where_they_name_a_type(name: str) -> None:
    for where, sub in subschemas(json_schemas()[name]):
        assert "discriminator" not in sub, where  # Ajv strict: unknown keyword
        if where != "#" and (not where.startswith("#/$defs/") or where.count("/") > 2):
            assert "title" not in sub, where  # json2ts would export an alias per field title


@pytest.mark.parametrize(
    "name",
    ["tool_call_event.v1.json", "tool_result.v1.json", "notification.v1.json", "cache_invalidation.v1.json"],
)
def test_objects_whose_keys_the_contract_fixes_are_closed(name: str) -> None:
    objects = [(where, sub) for where, sub in subschemas(json_schemas()[name]) if "properties" in sub]

    assert objects
    for where, sub in objects:
        assert sub.get("additionalProperties") is False, where


def test_dead_letter_headers_stay_open_for_the_headers_the_message_had() -> None:
    schema = json_schemas()["dead_letter_headers.v1.json"]
    headers = {
        "x-ltm-error": "body is not JSON",
        "x-ltm-error-kind": "malformed",
        "x-ltm-attempts": 1,
        "x-ltm-failed-at": "2026-12-02T08:00:00Z",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    }

    assert "additionalProperties" not in schema
    assert_conforms("dead_letter_headers.v1.json", headers)
    assert errors("dead_letter_headers.v1.json", {**headers, "x-ltm-error-kind": "bug"})


def test_each_type_name_is_declared_by_one_file_only() -> None:
    # json2ts exports a type per title; one name in two files clashes in a barrel module (TS2308)
    everything = [sub for schema in json_schemas().values() for _, sub in subschemas(schema)]
    names = [sub["title"] for sub in everything if "title" in sub]
    assert len(names) == len(set(names)), sorted(name for name in names if names.count(name) > 1)


def test_cache_invalidation_is_a_plain_one_of_by_kind() -> None:
    schema = json_schemas()["cache_invalidation.v1.json"]
    kinds = {
        schema["$defs"][ref["$ref"].removeprefix("#/$defs/")]["properties"]["kind"]["const"]
        for ref in schema["oneOf"]
    }
    assert kinds == {"tomori_state", "user"}

    for message in (
        {
            "schema_version": 1,
            "invalidation_id": INVALIDATION_ID,
            "kind": "tomori_state",
            "server_disc_id": "1",
        },
        {"schema_version": 1, "invalidation_id": INVALIDATION_ID, "kind": "user", "user_disc_id": "2"},
    ):
        assert_conforms("cache_invalidation.v1.json", message)
    mixed = {"schema_version": 1, "invalidation_id": INVALIDATION_ID, "kind": "user", "server_disc_id": "1"}
    assert errors("cache_invalidation.v1.json", mixed)
    assert errors("cache_invalidation.v1.json", {**mixed, "kind": "guild"})


def test_an_invalidation_names_no_event_id() -> None:
    """The channel every shard reads carries an opaque id of the save, never the event_id the ledger answers
    by (security review 3, section 4): the schema refuses an invalidation with an event_id."""
    server = {
        "schema_version": 1,
        "invalidation_id": INVALIDATION_ID,
        "kind": "tomori_state",
        "server_disc_id": "1",
    }
    assert errors("cache_invalidation.v1.json", {**server, "event_id": EVENT_ID})
    old = {"schema_version": 1, "event_id": EVENT_ID, "kind": "tomori_state", "server_disc_id": "1"}
    assert errors("cache_invalidation.v1.json", old)
    # the formula CONTRACT.md gives, so the shard that sent the event can recompute it
    assert hashlib.sha256(f"tomori-ltm-invalidation:{EVENT_ID}".encode()).hexdigest() == INVALIDATION_ID
    assert EVENT_ID.replace("-", "") not in INVALIDATION_ID
    assert invalidation_id(UUID(EVENT_ID.upper())) == INVALIDATION_ID  # of the id, not of its spelling


def test_arguments_is_the_any_schema() -> None:
    # exactly {}: json2ts types it `unknown`; a description or default beside it makes it an object
    assert json_schemas()["tool_call_event.v1.json"]["properties"]["arguments"] == {}


def test_the_contract_example_conforms_to_the_event_schema() -> None:
    assert_conforms("tool_call_event.v1.json", CONTRACT_EVENT)


@pytest.mark.parametrize(
    "arguments",
    [{"memory_content": "x"}, {}, ["a", 1], "a string", None, 3, 2.5, True],
    ids=["object", "empty object", "array", "string", "null", "integer", "float", "boolean"],
)
def test_the_event_schema_takes_arguments_of_any_json_type(arguments: Any) -> None:
    assert_conforms("tool_call_event.v1.json", event(arguments=arguments))
    body = event()
    del body["arguments"]
    assert_conforms("tool_call_event.v1.json", body)


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"shard_id": "3"}, id="string shard_id"),
        pytest.param({"shard_id": -1}, id="negative shard_id"),
        pytest.param({"shard_id": True}, id="boolean shard_id"),
        pytest.param({"event_id": "not-a-uuid"}, id="non-UUID event_id"),
        pytest.param({"schema_version": 2}, id="unknown schema_version"),
        pytest.param({"schema_version": "1"}, id="string schema_version"),
        pytest.param({"tool_name": "forget_everything"}, id="unknown tool_name"),
        pytest.param({"tool_call_id": 8731}, id="numeric tool_call_id"),
        pytest.param({"issued_at": "2026-12-02T08:00:00"}, id="issued_at without offset"),
        pytest.param({"context": None}, id="null context"),
        pytest.param({"guild_memberz": []}, id="misspelt top-level key"),
    ],
)
def test_the_event_schema_rejects_what_the_worker_rejects_and_typos(changes: dict[str, Any]) -> None:
    assert errors("tool_call_event.v1.json", event(**changes))


@pytest.mark.parametrize(
    ("field", "value"),
    [("channel_disc_id", "1234"), ("persona_id", "7"), ("guild_memberz", []), ("guild_members", [{}])],
)
def test_the_event_schema_checks_the_context(field: str, value: Any) -> None:
    body = event()
    body["context"][field] = value
    assert errors("tool_call_event.v1.json", body)


def test_the_event_schema_caps_guild_members() -> None:
    body = event()
    body["context"]["guild_members"] = body["context"]["guild_members"] * 1001
    assert errors("tool_call_event.v1.json", body)


NOTIFICATION = Notification.model_validate(
    {
        "event_id": EVENT_ID,
        "guild_disc_id": "1150000000000000001",
        "channel_disc_id": "1150000000000000100",
        "thread_id": None,
        "reply_via": {"webhook_disc_id": "1150000000000000300", "username": "Alt", "avatar_url": None},
        "notice": {
            "kind": "personal_memory",
            "title": "t",
            "description": "d",
            "footer": "f",
            "full_content": "c",
            "expandable": True,
        },
    }
)


def every_outcome() -> list[Any]:
    """One real outcome of the pipeline's own builders per status and per shape of its data."""
    from worker.pipeline import outcome, steps
    from worker.pipeline.plan import SavePlan, Target
    from worker.pipeline.state import PersonaState, ServerState, UserRecord

    def saved(scope: str, label: str | None) -> Any:
        invalidation = ServerStateInvalidation(invalidation_id=INVALIDATION_ID, server_disc_id="1")
        server = ServerState(server_id=1, server_disc_id="1")
        persona = PersonaState(persona_id=7, nickname="Tomori", lineage_id=10000)
        author = UserRecord(user_id=1, user_disc_id="2")
        target = Target(label, UserRecord(user_id=3, user_disc_id="4")) if label is not None else None
        plan = SavePlan("{user} likes dogs", server, persona, author, target, invalidation)
        assert plan.scope == scope
        return steps.saved(plan, 123)

    return [
        outcome.content_missing(),
        outcome.target_missing(),
        outcome.invalid_arguments("Invalid parameters: arguments must be an object"),
        outcome.disabled(),
        outcome.critical_state_missing(),
        outcome.ambiguous_user("Sparrow", ("A", "B", "C", "D")),
        outcome.user_not_found("Nobody"),
        outcome.content_too_long(1000),
        outcome.content_empty(),
        outcome.lineage_zero(),
        outcome.server_limit_reached(100, 100),
        outcome.target_unknown("sparrow"),
        outcome.privacy_restricted("sparrow"),
        outcome.personal_limit_reached("sparrow", 3, 3),
        outcome.database_error(),
        outcome.internal_error(DeadLetterKind.INTERNAL),
        outcome.internal_error(DeadLetterKind.SCHEMA),
        saved("target_user", "Sparrow (@sparrow_ow)"),
        saved("server_wide", None),
    ]


def test_every_status_has_an_outcome_here() -> None:
    assert {outcome.status for outcome in every_outcome()} == set(list(Status))


@pytest.mark.parametrize("outcome", every_outcome(), ids=lambda outcome: outcome.status)
def test_every_real_result_conforms(outcome: Any) -> None:
    result = result_of(outcome)

    assert_conforms("tool_result.v1.json", result)
    assert_conforms("tool_result.v1.json", {**result, "replayed": True})


def test_a_misspelt_or_unknown_key_in_a_result_fails() -> None:
    saved = result_of(every_outcome()[-1])

    assert errors("tool_result.v1.json", {**saved, "replayd": True})
    assert errors("tool_result.v1.json", {**saved, "data": {**saved["data"], "memory": 1}})
    failed = result_of(every_outcome()[0])
    assert errors("tool_result.v1.json", {**failed, "data": {**failed["data"], "memory_id": 1}})


def test_a_result_whose_parts_disagree_with_its_status_fails() -> None:
    saved = result_of(every_outcome()[-1])
    failed = result_of(every_outcome()[0])

    assert errors("tool_result.v1.json", {**saved, "success": False})
    assert errors("tool_result.v1.json", {**saved, "error": "x"})
    assert errors("tool_result.v1.json", {**saved, "data": failed["data"]})
    assert errors("tool_result.v1.json", {**failed, "status": "memory_save_failed_db_error"})
    assert errors("tool_result.v1.json", {**failed, "message": "Memory saved successfully"})
    assert errors("tool_result.v1.json", {**failed, "data": {**failed["data"], "candidates": ["a"] * 4}})


def test_data_shapes_cover_every_status_in_the_order_of_status() -> None:
    assert list(RESULT_DATA) == list(list(Status))
    statuses = [branch["properties"]["status"]["const"] for branch in result_branches()]
    assert statuses == list(list(Status))


def test_a_real_notification_conforms_and_a_typo_fails() -> None:
    notification = NOTIFICATION.model_dump(mode="json")

    assert_conforms("notification.v1.json", notification)
    assert errors("notification.v1.json", {**notification, "notice": {**notification["notice"], "colour": 1}})
    assert errors("notification.v1.json", {**notification, "reply_via": {"username": "Alt"}})


def test_asyncapi_amqp_bindings_follow_the_0_3_0_binding_schemas() -> None:
    # @asyncapi/parser rejects deliveryMode in a message binding: it is an operation binding in 0.3.0
    from contracts.asyncapi import asyncapi_document

    document = asyncapi_document()
    for name, message in document["components"]["messages"].items():
        amqp = message.get("bindings", {}).get("amqp", {})
        assert set(amqp) <= {"contentEncoding", "messageType", "bindingVersion"}, name
    sends = [op for op in document["operations"].values() if "bindings" in op and op["action"] == "send"]
    assert len(sends) == 3
    for operation in sends:
        assert operation["bindings"]["amqp"]["deliveryMode"] == 2
        assert operation["bindings"]["amqp"]["bindingVersion"] == "0.3.0"
