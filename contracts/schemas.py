"""JSON Schema files of the wire models, for the TypeScript bot.

The files under ``contracts/schemas/`` are generated from :mod:`contracts.models`, never edited by hand::

    python -m contracts.schemas          # regenerate them
    python -m contracts.schemas --check  # exit 1 when a file differs from what the models generate

Inbound messages (what a shard sends) are described as the worker validates them; outbound messages
(what the worker emits) as the worker serialises them, with every field required because the worker
always writes every field.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode
from pydantic_core import core_schema

from contracts.asyncapi import ASYNCAPI_FILE, asyncapi_document
from contracts.models import (
    CacheInvalidation,
    DeadLetterHeaders,
    Notification,
    ToolCallEvent,
    ToolResult,
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
        return self.mode == "serialization" or super().field_is_required(field, total)


@dataclass(frozen=True, slots=True)
class _SchemaSource:
    stem: str
    target: type[BaseModel] | TypeAdapter[Any]
    mode: JsonSchemaMode
    title: str
    description: str


def _model(stem: str, model: type[BaseModel], direction: Literal["inbound", "outbound"]) -> _SchemaSource:
    mode: JsonSchemaMode = "validation" if direction == "inbound" else "serialization"
    return _SchemaSource(stem, model, mode, model.__name__, inspect.cleandoc(model.__doc__ or ""))


_SOURCES = (
    _model("tool_call_event.v1", ToolCallEvent, "inbound"),
    _model("tool_result.v1", ToolResult, "outbound"),
    _model("notification.v1", Notification, "outbound"),
    _SchemaSource(
        "cache_invalidation.v1",
        TypeAdapter(CacheInvalidation),
        "serialization",
        "CacheInvalidation",
        "Redis pub/sub message on `tomori:cache-invalidation`, published after a successful save: "
        "`tomori_state` after a server-wide save, `user` after a personal save (discriminated by `kind`).",
    ),
    _model("dead_letter_headers.v1", DeadLetterHeaders, "outbound"),
)


def json_schemas() -> dict[str, dict[str, Any]]:
    """Every contract schema, keyed by file name (``tool_call_event.v1.json`` ...)."""
    schemas: dict[str, dict[str, Any]] = {}
    for source in _SOURCES:
        if isinstance(source.target, TypeAdapter):
            schema = source.target.json_schema(mode=source.mode, schema_generator=_OutboundJsonSchema)
        else:
            schema = source.target.model_json_schema(mode=source.mode, schema_generator=_OutboundJsonSchema)
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


def contract_files() -> dict[str, dict[str, Any]]:
    """Every generated file: the JSON Schemas and the AsyncAPI document that points at them."""
    return {**json_schemas(), ASYNCAPI_FILE: asyncapi_document()}


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
