"""The committed JSON Schema files as validators: what tests hold the worker's real messages against."""

from __future__ import annotations

import json
from datetime import datetime
from functools import cache
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker

from contracts.schemas import SCHEMA_DIR

_FORMATS = FormatChecker()


@_FORMATS.checks("date-time", raises=ValueError)
def _rfc3339(value: object) -> bool:
    # jsonschema checks date-time only with an optional package; RFC 3339 asks for an offset
    if not isinstance(value, str):
        return True
    return datetime.fromisoformat(value).tzinfo is not None


@cache
def validator(name: str) -> Draft202012Validator:
    """A 2020-12 validator, formats checked, for the schema file ``name`` (``tool_result.v1.json`` ...)."""
    schema = json.loads((SCHEMA_DIR / name).read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=_FORMATS)


def errors(name: str, instance: Any) -> list[str]:
    """Every way ``instance`` breaks the schema ``name``, as one line each (empty when it conforms)."""
    return sorted(
        f"{'/'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}"
        for error in validator(name).iter_errors(instance)
    )


def assert_conforms(name: str, instance: Any) -> None:
    """Fail naming each error when ``instance`` does not conform to the schema file ``name``."""
    found = errors(name, instance)
    assert not found, f"{name}:\n  " + "\n  ".join(found)
