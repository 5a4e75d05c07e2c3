"""The tool's arguments as the contract publishes them (CreateMemoryArguments, the model's tool declaration)
agree with what the worker's step 1 judges, and the missing-state words name each missing row."""

from __future__ import annotations

from typing import Any

from contracts.models import TOOL_NAMES, ToolCallEvent, tool_declaration
from contracts.schemas import json_schemas
from worker.ops.demo import AUTHOR, GUILD, PERSONA_ID, example_event
from worker.pipeline.arguments import (
    MEMORY_SCOPES,
    PARAMETER_TYPES,
    REQUIRED_PARAMETERS,
    TARGET_KEYS,
    validate_arguments,
)
from worker.pipeline.state import LoadedState, PersonaState, ServerState, UserRecord
from worker.pipeline.steps import missing_state


def test_the_declaration_is_the_worker_s_parameter_schema() -> None:
    declared = tool_declaration()
    parameters = declared["parameters"]

    assert declared["name"] == TOOL_NAMES[0]
    assert list(parameters["properties"]) == list(PARAMETER_TYPES)
    assert {k: v["type"] for k, v in parameters["properties"].items()} == PARAMETER_TYPES
    assert tuple(parameters["required"]) == REQUIRED_PARAMETERS
    assert tuple(parameters["properties"]["memory_scope"]["enum"]) == MEMORY_SCOPES


def test_the_arguments_type_lists_every_key_the_worker_reads() -> None:
    schema = json_schemas()["create_memory_arguments.v1.json"]

    assert set(schema["properties"]) == set(PARAMETER_TYPES) | set(TARGET_KEYS)
    assert schema["required"] == list(REQUIRED_PARAMETERS)
    assert "additionalProperties" not in schema  # the worker ignores keys it does not know


def test_the_demo_s_arguments_pass_step_one() -> None:
    for scope in ("server_wide", "target_user"):
        arguments: Any = example_event(scope)["arguments"]
        assert not isinstance(validate_arguments(arguments), str), scope


def _event(**context: Any) -> ToolCallEvent:
    body = example_event("server_wide")
    body["context"].update(context)
    return ToolCallEvent.model_validate(body)


def test_missing_state_names_each_missing_row() -> None:
    server = ServerState(server_id=1, server_disc_id=GUILD)
    persona = PersonaState(persona_id=PERSONA_ID, nickname="Tomori", lineage_id=10000)
    author = {AUTHOR: UserRecord(user_id=1, user_disc_id=AUTHOR)}

    assert missing_state(_event(), LoadedState(server, persona, author)) == []
    assert missing_state(_event(), LoadedState(None, None, {})) == [
        f"no servers row for guild {GUILD}",
        f"no personas row with persona_id {PERSONA_ID} on that server",
        f"no users row for the author {AUTHOR}",
    ]
    assert missing_state(_event(), LoadedState(server, None, author)) == [
        f"no personas row with persona_id {PERSONA_ID} on that server"
    ]
    assert missing_state(_event(guild_disc_id=None), LoadedState(None, persona, author)) == [
        f"no servers row for the DM of user {AUTHOR}"
    ]
    assert missing_state(_event(triggering_user_disc_id=None), LoadedState(server, persona, {})) == [
        "no author: the event's triggering_user_disc_id is null"
    ]
