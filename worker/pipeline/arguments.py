"""Step 1 of SPEC.md: judge the model's untrusted ``arguments`` like the original ``validateParameters``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: the tool's parameter schema, in the original's property order: name -> JSON type
PARAMETER_TYPES: dict[str, str] = {
    "memory_content": "string",
    "memory_scope": "string",
    "target_user": "string",
}
REQUIRED_PARAMETERS = ("memory_content", "memory_scope")
MEMORY_SCOPES = ("server_wide", "target_user")
#: the target string is the first non-empty trimmed value of these, in this order
TARGET_KEYS = ("target_user", "target_user_nickname", "target_user_discord_id")

NOT_AN_OBJECT = "Invalid parameters: arguments must be an object"

_NOT_TEXT = re.compile("[\x00\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class UnreadableArguments:
    """``arguments`` the worker could not read at all (nested deeper than its JSON reader goes): the rest of
    the event was read around them (:mod:`worker.broker.envelope`), and step 1 answers them as invalid."""

    why: str

    @property
    def sentence(self) -> str:
        return f"Invalid parameters: {self.why}"


def text_error(name: str, value: str) -> str | None:
    """The validator-style error for a string the worker cannot store or send (Postgres refuses U+0000 in
    text, and a lone surrogate, from an escape such as ``\\ud800``, has no UTF-8), else ``None``."""
    bad = _NOT_TEXT.search(value)
    if bad is None:
        return None
    if bad.group() == "\x00":
        return f"Parameter '{name}' must not contain NUL characters"
    return f"Parameter '{name}' is not valid Unicode (a lone surrogate)"


def js_type_name(value: object) -> str:
    """The name the original's validator uses for a JSON value's type (``typeof``, arrays apart)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if value is None:
        return "null"
    return "object"


@dataclass(frozen=True, slots=True)
class MemoryArguments:
    """Arguments that passed step 1. ``content`` and ``scope`` are strings; nothing is trimmed yet."""

    content: str
    scope: str
    raw: Mapping[str, Any]


def validate_arguments(arguments: object) -> MemoryArguments | str:
    """Return the accepted arguments, or the ``Invalid parameters: …`` sentence that rejects them.

    Required keys must be present and not null; each supplied schema key (null counts as not supplied)
    must have the right JSON type; ``memory_scope`` must be one of the enum values, case-sensitive.
    Unknown keys are ignored. When type or enum errors exist only they are listed, as the original does.
    A string parameter holding U+0000 or a lone surrogate is such an error too (:func:`text_error`): the
    original's database would refuse it; this worker answers it here, before anything is written.
    """
    if isinstance(arguments, UnreadableArguments):
        return arguments.sentence
    if not isinstance(arguments, dict):
        return NOT_AN_OBJECT
    missing = [name for name in REQUIRED_PARAMETERS if arguments.get(name) is None]
    errors: list[str] = []
    for name, expected in PARAMETER_TYPES.items():
        value = arguments.get(name)
        if value is None:
            continue
        actual = js_type_name(value)
        if actual != expected:
            errors.append(f"Parameter '{name}' expected type '{expected}' but got '{actual}'")
        elif name == "memory_scope" and value not in MEMORY_SCOPES:
            errors.append(f"Parameter '{name}' must be one of: {', '.join(MEMORY_SCOPES)}")
        elif (not_text := text_error(name, value)) is not None:
            errors.append(not_text)
    if errors:
        return "Invalid parameters: " + ", ".join(errors)
    if missing:
        return "Invalid parameters: Missing required parameters: " + ", ".join(missing)
    return MemoryArguments(
        content=arguments["memory_content"], scope=arguments["memory_scope"], raw=arguments
    )


def target_string(arguments: MemoryArguments, trim: Any) -> str | None:
    """The target string: the first non-empty trimmed value of :data:`TARGET_KEYS`, else ``None``.

    ``trim`` is the JS-compatible trim. A legacy key holding a non-string is skipped here; the caller
    rejects it (see :func:`legacy_type_error`).
    """
    for key in TARGET_KEYS:
        value = arguments.raw.get(key)
        if isinstance(value, str):
            trimmed: str = trim(value)
            if trimmed:
                return trimmed
    return None


def legacy_type_error(arguments: MemoryArguments, trim: Any) -> str | None:
    """A legacy target key (not in the schema) holding a non-string value, reached before any target.

    The original would crash on ``.trim()`` of such a value; the worker answers it as invalid arguments
    with the validator's own sentence instead (docs/decisions.md). So it does for a legacy key it would
    use that holds U+0000 or a lone surrogate (:func:`text_error`).
    """
    for key in TARGET_KEYS:
        value = arguments.raw.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            actual = js_type_name(value)
            return f"Invalid parameters: Parameter '{key}' expected type 'string' but got '{actual}'"
        if (not_text := text_error(key, value)) is not None:
            return f"Invalid parameters: {not_text}"
        if trim(value):
            return None
    return None
