"""Step 1 of SPEC.md: read a delivery's body as a tool-call event, or say why it is a dead letter.

Three stages, each bounded in time so that no body holds the event loop for long (``python -m bench.envelope``
measures them):

1. **Parse.** orjson, and when orjson refuses a body that is UTF-8, a tolerant second reading
   (:func:`_tolerant`): Python's ``json`` for values orjson does not take (a lone surrogate escape such
   as ``\\ud800``, ``1e400``, ``NaN``), or, for a body nested deeper than orjson reads (1024 levels), the
   envelope read around its top-level ``arguments``, which the pipeline then answers as unreadable
   arguments. Only a body that is not UTF-8 JSON, or whose envelope itself cannot be read, is ``malformed``.
2. **Models.** pydantic builds the :class:`ToolCallEvent`. The models carry every bound of CONTRACT.md (list
   lengths, string lengths, no U+0000, no lone surrogate), and pydantic checks a list's length before its
   items, so an over-bound event is refused in well under a millisecond with one error, never 120,000.
3. **Naming the field.** Only for an event pydantic refused, :func:`envelope_problem` walks the parsed JSON
   once and names the first broken field (``context.participants: 120000 items, at most 100``); an accepted
   event does not pay for the walk (29 µs of a bench event's 58). The AMQP ``message_id``, when it is a
   canonical UUID, must be the body's ``event_id``.
"""

from __future__ import annotations

import json
import re
import secrets
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any
from uuid import UUID

import orjson
from pydantic import ValidationError

from contracts.models import (
    CANONICAL_UUID,
    MAX_ALIASES,
    MAX_AVATAR_URL,
    MAX_BODY_BYTES,
    MAX_DATE_TIME,
    MAX_DISCORD_NAME,
    MAX_GUILD_MEMBERS,
    MAX_INT4,
    MAX_LABEL,
    MAX_PARTICIPANTS,
    MAX_TARGET_ID,
    MAX_TOOL_CALL_ID_BYTES,
    MAX_WEBHOOK_USERNAME,
    TOOL_NAMES,
    DeadLetterKind,
    ToolCallEvent,
)
from worker.pipeline.arguments import UnreadableArguments

#: how deep orjson reads; a body nested deeper is read around its ``arguments`` (:func:`_around_arguments`)
ORJSON_MAX_DEPTH = 1024
#: at most this many ``"arguments":`` keys and this many candidate ends are tried around deep arguments (each
#: try is one orjson parse of part of the body, so the whole reading stays within a few milliseconds)
_ARGUMENT_KEYS_TRIED = 3
_ENDS_TRIED = 8

_CANONICAL = re.compile(CANONICAL_UUID)
_SNOWFLAKE = re.compile(r"[0-9]{17,20}")
_NOT_TEXT = re.compile("[\x00\ud800-\udfff]")
_ARGUMENTS_KEY = re.compile(rb'"arguments"\s*:\s*')
#: a key of the envelope after a comma: where the member after ``arguments`` may begin
_NEXT_KEY = re.compile(
    rb',\s*"(?:schema_version|event_id|tool_call_id|tool_name|issued_at|shard_id|context|arguments)"\s*:'
)


@dataclass(frozen=True, slots=True)
class RoutableIds:
    """What a shard needs to be answered even when the rest of the envelope is broken."""

    event_id: UUID
    tool_call_id: str
    shard_id: int
    tool_name: str


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A body that is not a valid event: ``malformed`` or ``schema`` (CONTRACT.md "Dead letters")."""

    kind: DeadLetterKind
    error: str
    ids: RoutableIds | None = None


def read_event(body: bytes, message_id: str | None = None) -> ToolCallEvent | Unreadable:
    """Parse ``body`` with the contract models; never raises.

    ``message_id`` is the delivery's AMQP ``message_id``: when it is a UUID in the canonical form it must be
    the body's ``event_id``. Other values are not read: none, or the 32 hex digits aiormq makes up for a
    publish without one (the worker's own retry copies of such an event get one that way, and so does a
    ``worker dlq replay`` of it).
    """
    if len(body) > MAX_BODY_BYTES:
        return Unreadable(
            DeadLetterKind.SCHEMA, f"body of {len(body)} bytes is over the {MAX_BODY_BYTES} byte limit"
        )
    data = _parse(body)
    if isinstance(data, Unreadable):
        return data
    if not isinstance(data, dict):
        return Unreadable(
            DeadLetterKind.MALFORMED,
            f"JSON {type(data).__name__ if data is not None else 'null'} is not an object",
        )
    # The models carry every bound, and pydantic checks a list's length before its items, so an over-bound
    # event fails fast there too; the walk that names the broken field runs only for an event it refused.
    problem: str | None = None
    try:
        event = ToolCallEvent.model_validate(data)
    except ValidationError as exc:
        problem = envelope_problem(data) or _describe(exc)
    if problem is not None:
        if isinstance(data.get("arguments"), UnreadableArguments):
            problem += f" (the body was read around arguments nested over {ORJSON_MAX_DEPTH} levels deep)"
        return Unreadable(
            DeadLetterKind.SCHEMA, _one_line(f"envelope breaks the contract: {problem}"), routable_ids(data)
        )
    if message_id is not None and _CANONICAL.match(message_id) and message_id != data["event_id"]:
        return Unreadable(
            DeadLetterKind.SCHEMA,
            _one_line(f"message_id {message_id!r} is not the body's event_id {data['event_id']}"),
            routable_ids(data),
        )
    return event


def routable_ids(data: dict[str, Any]) -> RoutableIds | None:
    """``event_id``, ``tool_call_id`` and ``shard_id`` when all three can still be read and carried back.

    The ``event_id`` must be in the canonical form (the shard matches its answer by it), the ``tool_call_id``
    must fit the result's AMQP ``correlation_id`` (255 bytes), and the ``shard_id`` must name a routing key
    the contract allows.
    """
    raw_id, call_id, shard = data.get("event_id"), data.get("tool_call_id"), data.get("shard_id")
    if not isinstance(raw_id, str) or not _CANONICAL.match(raw_id):
        return None
    if not isinstance(call_id, str) or _carried_bytes(call_id) is None:
        return None
    if not isinstance(shard, int) or isinstance(shard, bool) or not 0 <= shard <= MAX_INT4:
        return None
    tool_name = data.get("tool_name")
    return RoutableIds(UUID(raw_id), call_id, shard, tool_name if tool_name in TOOL_NAMES else TOOL_NAMES[0])


def _carried_bytes(call_id: object) -> int | None:
    """The UTF-8 length of a ``tool_call_id`` that a result can carry, else ``None``."""
    if not isinstance(call_id, str):
        return None
    try:
        size = len(call_id.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 for it
        return None
    return size if size <= MAX_TOOL_CALL_ID_BYTES else None


# --- 1. parse --------------------------------------------------------------------------------------------


def _parse(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return _tolerant(body, exc)


def _tolerant(body: bytes, refused: orjson.JSONDecodeError) -> Any:
    """The second reading of a body orjson refused (module docstring); ``Unreadable`` when there is none."""
    malformed = Unreadable(DeadLetterKind.MALFORMED, f"not UTF-8 JSON: {_one_line(str(refused))}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:  # say where, not orjson's wording (it speaks of surrogates)
        bad = body[exc.start : exc.end]
        return Unreadable(
            DeadLetterKind.MALFORMED, f"not UTF-8 JSON: not UTF-8 (byte 0x{bad[0]:02x} at offset {exc.start})"
        )
    if str(refused).startswith("depth limit exceeded"):
        around = _around_arguments(body, refused.pos)
        if around is None:
            return Unreadable(
                DeadLetterKind.MALFORMED,
                f"nested deeper than {ORJSON_MAX_DEPTH} levels outside the top-level arguments "
                f"(at byte {refused.pos})",
            )
        return around
    try:
        # Python's reader takes what orjson refuses among valid JSON text: lone surrogate escapes, numbers
        # beyond a double (1e400 reads as inf); and NaN/Infinity. Its integers stop at 4300 digits and its
        # depth at the interpreter's recursion limit.
        return json.loads(text)
    except (ValueError, RecursionError):
        return malformed


def _around_arguments(body: bytes, deep_at: int) -> dict[str, Any] | None:
    """The envelope of a body nested too deeply to parse, its top-level ``arguments`` replaced by
    :class:`UnreadableArguments`; ``None`` when the deep part is not inside the top-level ``arguments``.

    orjson stopped at byte ``deep_at``. The ``arguments`` key is looked for before it and the member after
    ``arguments`` (a key of the envelope after a comma, or the closing brace) after it. Each guess is checked
    by parsing: the part before the value must be an object that is only missing that value (a marker put in
    its place must come back as the top-level ``arguments``), and the part from the member after it must
    parse as the object's remaining members (so the deep part is not there). The value replaced may take
    members after ``arguments`` with it when the deep part is in one of them (the event then usually breaks
    the envelope, and its dead letter says it was read around ``arguments``). A ``"arguments":`` or an
    envelope key inside a string cannot be mistaken for one (its quotes are escaped there). At most
    ``_ARGUMENT_KEYS_TRIED + _ENDS_TRIED + 1`` orjson parses, each of part of the body.
    """
    marker = f"ltm-unreadable-{secrets.token_hex(8)}"
    for key in islice(_ARGUMENTS_KEY.finditer(body, 0, deep_at), _ARGUMENT_KEYS_TRIED):
        try:
            head = orjson.loads(body[: key.end()] + orjson.dumps(marker) + b"}")
        except orjson.JSONDecodeError:
            continue
        if not isinstance(head, dict) or head.get("arguments") != marker:
            continue
        for end in _ends(body, deep_at):
            try:
                tail = orjson.loads(b"{" + body[end + 1 :])
            except orjson.JSONDecodeError:
                continue
            if isinstance(tail, dict):
                data = {**head, **tail}  # the members after arguments win, as a later duplicate key would
                if data["arguments"] == marker:
                    data["arguments"] = UnreadableArguments(
                        f"arguments are nested more than {ORJSON_MAX_DEPTH} levels deep"
                    )
                return data
        return None
    return None


def _ends(body: bytes, after: int) -> Iterator[int]:
    """Where the member after a deep ``arguments`` value may begin: the comma before an envelope key, then the
    object's closing brace (``arguments`` the last member): each ``end`` such that ``"{" + body[end + 1:]``
    is the object's remaining members.

    The last few keys are tried, earliest first: the members after ``arguments`` end the body, while envelope
    key names inside the arguments (the model writes them) come before them, however many there are.
    """
    # the deque takes the matches in C: thousands of planted keys cost a few milliseconds, not a Python loop
    yield from (m.start() for m in deque(_NEXT_KEY.finditer(body, after), maxlen=_ENDS_TRIED))
    closing = len(body.rstrip()) - 1
    if closing > after and body[closing : closing + 1] == b"}":
        yield closing - 1


# --- 2. bounds -------------------------------------------------------------------------------------------


def envelope_problem(data: dict[str, Any]) -> str | None:
    """The first list or string of the envelope over its bound (CONTRACT.md "Bounds"), or that holds U+0000
    or a lone surrogate, or an item of a list that is not what the contract says; ``None`` when there is none.

    A type that is wrong outside the lists is left to pydantic (a few fields, a few errors). ``arguments``
    is not the envelope: the pipeline judges it.
    """
    problem = _text(data, "tool_call_id", MAX_TOOL_CALL_ID_BYTES) or _text(data, "issued_at", MAX_DATE_TIME)
    if problem:
        return problem
    call_id = data.get("tool_call_id")
    if isinstance(call_id, str) and _carried_bytes(call_id) is None:
        return f"tool_call_id: more than {MAX_TOOL_CALL_ID_BYTES} bytes in UTF-8"
    context = data.get("context")
    if not isinstance(context, dict):
        return None
    reply_via = context.get("reply_via")
    if isinstance(reply_via, dict):
        problem = _text(reply_via, "username", MAX_WEBHOOK_USERNAME, "context.reply_via.") or _text(
            reply_via, "avatar_url", MAX_AVATAR_URL, "context.reply_via."
        )
        if problem:
            return problem
    return _participants_problem(context.get("participants")) or _members_problem(
        context.get("guild_members")
    )


def _participants_problem(participants: object) -> str | None:
    if not isinstance(participants, list):
        return None  # absent (the default), or pydantic's one error
    if len(participants) > MAX_PARTICIPANTS:
        return f"context.participants: {len(participants)} items, at most {MAX_PARTICIPANTS}"
    for i, item in enumerate(participants):
        where = f"context.participants.{i}."
        if not isinstance(item, dict):
            return f"{where[:-1]}: not an object"
        problem = (
            _text(item, "target_id", MAX_TARGET_ID, where, required=True)
            or _text(item, "display_label", MAX_LABEL, where, required=True)
            or _flag(item, "is_bridge", where)
        )
        if problem:
            return problem
        aliases = item.get("aliases", [])
        if not isinstance(aliases, list):
            return f"{where}aliases: not an array"
        if len(aliases) > MAX_ALIASES:
            return f"{where}aliases: {len(aliases)} items, at most {MAX_ALIASES}"
        for k, alias in enumerate(aliases):
            if not isinstance(alias, str):
                return f"{where}aliases.{k}: not a string"
            problem = _text_problem(alias, MAX_LABEL)
            if problem:
                return f"{where}aliases.{k}: {problem}"
    return None


def _members_problem(members: object) -> str | None:
    if not isinstance(members, list):
        return None
    if len(members) > MAX_GUILD_MEMBERS:
        return f"context.guild_members: {len(members)} items, at most {MAX_GUILD_MEMBERS}"
    for i, item in enumerate(members):
        where = f"context.guild_members.{i}."
        if not isinstance(item, dict):
            return f"{where[:-1]}: not an object"
        disc_id = item.get("user_disc_id")
        if not isinstance(disc_id, str) or not _SNOWFLAKE.fullmatch(disc_id):
            return f"{where}user_disc_id: not a Discord id (17 to 20 digits)"
        problem = (
            _text(item, "username", MAX_DISCORD_NAME, where, required=True)
            or _text(item, "global_name", MAX_DISCORD_NAME, where)
            or _text(item, "nickname", MAX_DISCORD_NAME, where)
            or _flag(item, "is_bot", where)
        )
        if problem:
            return problem
    return None


def _text(
    obj: dict[str, Any], key: str, max_length: int, where: str = "", *, required: bool = False
) -> str | None:
    """A problem with ``obj[key]`` as a string of at most ``max_length`` characters; ``null`` or absent is
    one only when ``required``."""
    value = obj.get(key)
    if value is None:
        return f"{where}{key}: missing" if required else None
    if not isinstance(value, str):
        return f"{where}{key}: not a string"
    problem = _text_problem(value, max_length)
    return f"{where}{key}: {problem}" if problem else None


def _text_problem(value: str, max_length: int) -> str | None:
    if len(value) > max_length:
        return f"{len(value)} characters, at most {max_length}"
    bad = _NOT_TEXT.search(value)
    if bad is None:
        return None
    return "holds U+0000" if bad.group() == "\x00" else "holds a lone surrogate (not Unicode text)"


def _flag(obj: dict[str, Any], key: str, where: str) -> str | None:
    value = obj.get(key, False)
    return None if isinstance(value, bool) else f"{where}{key}: not a boolean"


# --- 3. models -------------------------------------------------------------------------------------------


def _describe(exc: ValidationError) -> str:
    """Each broken field: ``shard_id: Input should be …; context.persona_id: …``."""
    parts = []
    for error in exc.errors(include_url=False, include_input=False)[:5]:
        where = ".".join(str(p) for p in error["loc"]) or "body"
        parts.append(f"{where}: {error['msg']}")
    more = f" (+{exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
    return "; ".join(parts) + more


def _one_line(text: str, limit: int = 500) -> str:
    flat = " ".join(text.split())
    flat = flat if len(flat) <= limit else flat[: limit - 1] + "…"
    # a header value is UTF-8: a lone surrogate from the body is written as its escape
    return flat.encode("utf-8", "backslashreplace").decode("utf-8")
