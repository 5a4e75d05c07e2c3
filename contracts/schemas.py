"""JSON Schema files of the wire models, for the TypeScript bot.

The files under ``contracts/schemas/`` are generated from :mod:`contracts.models`, never edited by hand::

    python -m contracts.schemas          # regenerate them
    python -m contracts.schemas --check  # exit 1 when a file differs from what the models generate

Inbound messages (what a shard sends) are described as the worker validates them; outbound messages
(what the worker emits) as the worker serialises them, with every field required because the worker
always writes every field.

pydantic's output is then tidied so that JSON Schema tools take it as it is (Ajv 8 in strict mode,
json-schema-to-typescript, the AsyncAPI parser): no per-field ``title`` (json2ts would turn each into
a type alias, ``EventId1`` ...), no OpenAPI ``discriminator`` (plain ``oneOf`` + ``const`` instead),
``additionalProperties: false`` on every object whose keys the contract fixes, and a tool result typed
per status (``oneOf`` over the statuses, each with its own ``data``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode
from pydantic_core import core_schema

from contracts.asyncapi import ASYNCAPI_FILE, asyncapi_document
from contracts.models import (
    RESULT_DATA,
    SAVED_MESSAGE,
    CacheInvalidation,
    CreateMemoryArguments,
    DeadLetterHeaders,
    Notification,
    Status,
    ToolCallEvent,
    ToolResult,
    tool_declaration,
)

SCHEMA_DIR = Path(__file__).parent / "schemas"
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
REGENERATE_COMMAND = "python -m contracts.schemas"


class _OutboundJsonSchema(GenerateJsonSchema):
    """Marks fields with defaults as required in serialisation mode: the worker always writes them."""

    def field_is_required(
        self,
        field: core_schema.ModelField | core_schema.DataclassField | core_schema.TypedDictField,
        total: bool,
    ) -> bool:
        if field["type"] == "typed-dict-field":
            # a result's data: a key marked NotRequired is one the worker omits in some cases
            return super().field_is_required(field, total)
        return self.mode == "serialization" or super().field_is_required(field, total)


@dataclass(frozen=True, slots=True)
class _SchemaSource:
    stem: str
    target: type[BaseModel] | TypeAdapter[Any]
    mode: JsonSchemaMode
    title: str
    description: str
    #: ``additionalProperties: false`` on every object: the contract fixes its keys.
    closed: bool = True


def _model(
    stem: str, model: type[BaseModel], direction: Literal["inbound", "outbound"], note: str = ""
) -> _SchemaSource:
    mode: JsonSchemaMode = "validation" if direction == "inbound" else "serialization"
    description = " ".join(filter(None, [inspect.cleandoc(model.__doc__ or ""), note]))
    return _SchemaSource(stem, model, mode, model.__name__, description)


_EVENT_NOTE = (
    "`arguments` is the model's output, verbatim and untrusted: any JSON value (null when absent); the "
    "worker judges it and answers bad arguments with memory_save_failed_invalid_args, never a dead letter. "
    "The worker ignores unknown keys (CONTRACT.md), so a shard may send more; this schema lists the keys "
    "of version 1 and forbids others so that a shard validating what it sends catches a misspelt key "
    "(`guild_memberz`) before the worker silently ignores it. A key added to version 1 later is optional "
    "and appears here first."
)
_RESULT_NOTE = (
    "One branch per status: `success`, `message`, `error` and the keys of `data` follow from `status`."
)

_SOURCES = (
    _model("tool_call_event.v1", ToolCallEvent, "inbound", _EVENT_NOTE),
    _model("tool_result.v1", ToolResult, "outbound", _RESULT_NOTE),
    _model("notification.v1", Notification, "outbound"),
    _SchemaSource(
        "cache_invalidation.v1",
        TypeAdapter(CacheInvalidation),
        "serialization",
        "CacheInvalidation",
        "Redis pub/sub message on `tomori:cache-invalidation`, published after a successful save: "
        "`tomori_state` after a server-wide save, `user` after a personal save (one branch per `kind`).",
    ),
    _SchemaSource(
        "create_memory_arguments.v1",
        TypeAdapter(CreateMemoryArguments),
        "validation",
        CreateMemoryArguments.__name__,
        inspect.cleandoc(CreateMemoryArguments.__doc__ or ""),
        closed=False,
    ),
    _SchemaSource(
        "dead_letter_headers.v1",
        DeadLetterHeaders,
        "serialization",
        DeadLetterHeaders.__name__,
        inspect.cleandoc(DeadLetterHeaders.__doc__ or "")
        + " The message keeps the headers it had (traceparent, x-death ...), so other keys may be present.",
        closed=False,
    ),
)

# Keywords whose value is one subschema, a map of subschemas, or a list of subschemas (2020-12).
_ONE_SCHEMA = ("additionalProperties", "items", "contains", "not", "if", "then", "else", "propertyNames")
_SCHEMA_MAP = ("properties", "patternProperties", "$defs", "dependentSchemas")
_SCHEMA_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")


def _tidy(schema: dict[str, Any], *, closed: bool, named: bool) -> dict[str, Any]:
    """``schema`` without pydantic's field titles and OpenAPI discriminator, closed where the contract is.

    ``named`` keeps the ``title`` of the root and of each ``$defs`` entry: json2ts names its types after them.
    """
    tidy: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "discriminator" or (key == "title" and not named):
            continue
        if key in _ONE_SCHEMA and isinstance(value, dict):
            value = _tidy(value, closed=closed, named=False)
        elif key in _SCHEMA_MAP:
            value = {name: _tidy(sub, closed=closed, named=key == "$defs") for name, sub in value.items()}
        elif key in _SCHEMA_LIST:
            value = [_tidy(sub, closed=closed, named=False) for sub in value]
        tidy[key] = value
    if closed and "properties" in tidy and "additionalProperties" not in tidy:
        tidy["additionalProperties"] = False
    return tidy


def _branch_name(status: str) -> str:
    """``memory_save_failed_user_not_found`` -> ``UserNotFoundResult``; the success is ``SavedResult``."""
    if status == Status.SAVED:
        return "SavedResult"
    return "".join(word.title() for word in status.removeprefix("memory_save_failed_").split("_")) + "Result"


def _result_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The tool result as a ``oneOf`` with one closed, complete branch per status.

    Each branch fixes ``success``, ``status``, ``message``, ``error`` and the shape of ``data`` for its
    status and lists every other key too: a branch that left them to a closed top level would have to stay
    open, and json2ts would give every branch an index signature (``[k: string]: unknown``).
    """
    shapes = [shape for status in Status for shape in RESULT_DATA[status]]
    shape_union: Any = Union[tuple(shapes)]  # noqa: UP007 (a union built at run time)
    data = TypeAdapter(shape_union).json_schema(mode="serialization", schema_generator=_OutboundJsonSchema)
    defs: dict[str, Any] = _tidy(data, closed=True, named=True)["$defs"]
    branches = []
    for status in Status:
        refs = [{"$ref": f"#/$defs/{shape.__name__}"} for shape in RESULT_DATA[status]]
        saved = status == Status.SAVED
        properties = {
            **schema["properties"],
            "success": {"const": saved},
            "status": {"const": status},
            "message": {"const": SAVED_MESSAGE} if saved else {"type": "null"},
            "error": {"type": "null"} if saved else {"type": "string"},
            "data": refs[0] if len(refs) == 1 else {"oneOf": refs},
        }
        name = _branch_name(status)
        defs[name] = {
            "title": name,
            "description": f"A result with status `{status}`.",
            "type": "object",
            "properties": properties,
            "required": schema["required"],
            "additionalProperties": False,
        }
        branches.append({"$ref": f"#/$defs/{name}"})
    return {"oneOf": branches, "$defs": defs}


def _inline(schema: Any, defs: dict[str, Any], names: set[str]) -> Any:
    """``schema`` with each ``$ref`` to one of ``names`` in ``defs`` replaced by that definition, untitled."""
    if isinstance(schema, list):
        return [_inline(item, defs, names) for item in schema]
    if not isinstance(schema, dict):
        return schema
    ref = schema.get("$ref", "")
    name = ref.removeprefix("#/$defs/")
    if ref.startswith("#/$defs/") and name in names:
        target = {key: value for key, value in defs[name].items() if key != "title"}
        rest = {key: value for key, value in schema.items() if key != "$ref"}
        return _inline({**target, **rest}, defs, names)
    return {key: _inline(value, defs, names) for key, value in schema.items()}


def _declare_once(schema: dict[str, Any], declared: set[str]) -> dict[str, Any]:
    """Inline the definitions an earlier file already declares, so each type name is exported once.

    json2ts turns each ``$defs`` entry into a named type; two files declaring ``ReplyVia`` would clash
    when their TypeScript is re-exported from one module (TS2308).
    """
    defs = schema.get("$defs", {})
    shared = declared.intersection(defs)
    declared.update(defs)  # in place: the caller's set carries the names to the next file
    if not shared:
        return schema
    kept = {name: sub for name, sub in defs.items() if name not in shared}
    tidy = _inline({key: value for key, value in schema.items() if key != "$defs"}, defs, shared)
    if kept:
        tidy["$defs"] = _inline(kept, defs, shared)
    return dict(tidy)


def _inline_enums(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with each enum of ``$defs`` (a ``StrEnum`` such as ``DeadLetterKind``) written in place.

    pydantic names an enum class in ``$defs``; the contract's files spell its values inline, as the
    ``Literal`` types the enums replaced did, so json2ts makes a union of strings, not a named enum type.
    """
    defs = schema.get("$defs", {})
    enums = {name: {"enum": sub["enum"], "type": sub["type"]} for name, sub in defs.items() if "enum" in sub}
    if not enums:
        return schema
    kept = {name: sub for name, sub in defs.items() if name not in enums}
    tidy = _inline({key: value for key, value in schema.items() if key != "$defs"}, enums, set(enums))
    if kept:
        tidy["$defs"] = _inline(kept, enums, set(enums))
    return dict(tidy)


def json_schemas() -> dict[str, dict[str, Any]]:
    """Every contract schema, keyed by file name (``tool_call_event.v1.json`` ...)."""
    schemas: dict[str, dict[str, Any]] = {}
    declared = {source.title for source in _SOURCES}
    for source in _SOURCES:
        if isinstance(source.target, TypeAdapter):
            schema = source.target.json_schema(mode=source.mode, schema_generator=_OutboundJsonSchema)
        else:
            schema = source.target.model_json_schema(mode=source.mode, schema_generator=_OutboundJsonSchema)
        schema = _inline_enums(_tidy(schema, closed=source.closed, named=True))
        if source.target is ToolResult:
            schema = _result_schema(schema)
        if source.target is ToolCallEvent:
            # any JSON value, null when absent: json2ts types exactly `{}` as `unknown` (a description or
            # a default beside it would make it an object), so the event's description speaks for it
            schema["properties"]["arguments"] = {}
        schema = _declare_once(schema, declared)
        schema.update(
            {
                "$schema": JSON_SCHEMA_DIALECT,
                "$id": f"urn:tomoribot:ltm:schema:{source.stem}",
                "title": source.title,
                "description": source.description,
            }
        )
        schemas[f"{source.stem}.json"] = schema
    return schemas


#: the model's tool declaration (not a message: no `.v1`, so the kit makes no type of it but a constant)
TOOL_DECLARATION_FILE = "create_long_term_memory.tool.json"


def contract_files() -> dict[str, dict[str, Any]]:
    """Every generated file: the JSON Schemas, the AsyncAPI document that points at them, and the model's
    tool declaration."""
    return {**json_schemas(), ASYNCAPI_FILE: asyncapi_document(), TOOL_DECLARATION_FILE: tool_declaration()}


def render(schema: dict[str, Any]) -> str:
    """A schema as its file holds it: pretty, key-sorted, newline-terminated JSON."""
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def stale_files(directory: Path = SCHEMA_DIR) -> list[str]:
    """File names under ``directory`` that differ from what the models generate, missing or extra."""
    expected = {name: render(schema) for name, schema in contract_files().items()}
    present = {path.name for path in directory.glob("*.json")} if directory.is_dir() else set()
    differing = [
        name
        for name, text in expected.items()
        if name not in present or (directory / name).read_text(encoding="utf-8") != text
    ]
    return sorted(differing + sorted(present - expected.keys()))


def write_files(directory: Path = SCHEMA_DIR) -> list[str]:
    """Write every schema under ``directory``, delete ``*.json`` no model generates; return what changed."""
    changed = stale_files(directory)
    directory.mkdir(parents=True, exist_ok=True)
    expected = {name: render(schema) for name, schema in contract_files().items()}
    for name, text in expected.items():
        (directory / name).write_text(text, encoding="utf-8")
    for path in directory.glob("*.json"):
        if path.name not in expected:
            path.unlink()
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m contracts.schemas [--check]``: regenerate the schema files, or check they are current."""
    parser = argparse.ArgumentParser(
        prog="python -m contracts.schemas", description="Generate the contract JSON Schema files."
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 listing the files that differ"
    )
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        if stale:
            print(f"out of date under {SCHEMA_DIR} (run `{REGENERATE_COMMAND}`):", file=sys.stderr)
            for name in stale:
                print(f"  {name}", file=sys.stderr)
            return 1
        return 0
    for name in write_files():
        print(f"updated {SCHEMA_DIR / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
