"""The envelope's names, bounds and field types (CONTRACT.md "Bounds"): the message types and tool names,
the limits of every list and string, the annotated types the models' fields are made of, and the models'
common base (frozen, unknown keys ignored).

Strict about the envelope (types are not coerced: ``"3"`` is not a shard id); no I/O, nothing from the worker.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
)

SCHEMA_VERSION = 1

#: Routing/tool names a shard may use for this tool (the alias stays the alias in the result).
TOOL_NAMES = ("create_long_term_memory", "remember_this_fact")
ToolName = Literal["create_long_term_memory", "remember_this_fact"]

#: AMQP ``type`` property of each message kind.
EVENT_TYPE = "tool_call.v1"
RESULT_TYPE = "tool_result.v1"
NOTIFICATION_TYPE = "notification.v1"


#: A body larger than this is dead-lettered as ``schema`` without being parsed.
MAX_BODY_BYTES = 256 * 1024

# The bounds of every list and string of the envelope (CONTRACT.md "Bounds"). The worker checks them on the
# parsed JSON before it builds the models (worker/broker/envelope.py), so no event costs more than a few
# milliseconds to refuse; the models and the JSON Schemas carry the same numbers.
#: ``guild_members``: 1000 members with three 32-character ASCII names each take about 190 KB of 256 KiB.
MAX_GUILD_MEMBERS = 1000
#: ``participants``: the conversation's tool-target references (the people in the turn's context).
MAX_PARTICIPANTS = 100
#: ``aliases`` of one participant (the original lists about eight kinds of name per person, plus the aliases
#: a discovery seed carried).
MAX_ALIASES = 32
#: Discord's limit for a username, a global (display) name and a guild nickname.
MAX_DISCORD_NAME = 32
#: a participant's ``display_label`` and each alias: a persona-relative name (prefix, nickname, suffix) or a
#: bridge display name.
MAX_LABEL = 256
#: a participant's ``target_id``: a Discord id, or a bridge user's id (a Matrix id is at most 255 characters).
MAX_TARGET_ID = 255
#: ``reply_via.username``: Discord's limit for a webhook message's username.
MAX_WEBHOOK_USERNAME = 80
#: ``reply_via.avatar_url``: a URL, or the ``data:image/...`` URI the original may pass.
MAX_AVATAR_URL = 128 * 1024
#: ``tool_call_id``: it travels back as the AMQP ``correlation_id``, a short string of at most 255 bytes.
MAX_TOOL_CALL_ID_BYTES = 255
#: ``issued_at``: an RFC 3339 date-time is about 35 characters.
MAX_DATE_TIME = 64
#: ``shard_id`` and ``persona_id`` are Postgres ``integer`` columns (int4).
MAX_INT4 = 2**31 - 1
#: ``event_id`` in the one form a shard gets back: lower case, hyphenated (``crypto.randomUUID()``).
CANONICAL_UUID = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
#: No text of the envelope may hold U+0000: Postgres refuses it in ``text`` and ``jsonb``.
NO_NUL = r"^[^\x00]*$"

DiscordId = Annotated[StrictStr, Field(pattern=r"^[0-9]{17,20}$", description="Discord snowflake")]


# strings of at most so many characters (code points), without U+0000
DiscordName = Annotated[StrictStr, Field(max_length=MAX_DISCORD_NAME, pattern=NO_NUL)]
Label = Annotated[StrictStr, Field(max_length=MAX_LABEL, pattern=NO_NUL)]
TargetId = Annotated[StrictStr, Field(max_length=MAX_TARGET_ID, pattern=NO_NUL)]
WebhookUsername = Annotated[StrictStr, Field(max_length=MAX_WEBHOOK_USERNAME, pattern=NO_NUL)]
AvatarUrl = Annotated[StrictStr, Field(max_length=MAX_AVATAR_URL, pattern=NO_NUL)]


def _fits_short_string(value: str) -> str:
    # the JSON Schema can only say 255 characters; the AMQP short string counts bytes
    if len(value.encode("utf-8", "surrogatepass")) > MAX_TOOL_CALL_ID_BYTES:
        raise ValueError(f"must be at most {MAX_TOOL_CALL_ID_BYTES} bytes in UTF-8")
    return value


def _canonical_uuid(value: Any) -> Any:
    # ``UUID`` alone takes upper case, braces, ``urn:uuid:`` and no hyphens, and gives the canonical form
    # back: a shard that sent another form could not match its result
    if isinstance(value, str) and not _CANONICAL_UUID.match(value):
        raise ValueError(
            "must be a lower-case UUID with hyphens (8-4-4-4-12), as crypto.randomUUID() writes it"
        )
    return value


_CANONICAL_UUID = re.compile(CANONICAL_UUID)


def _reject_bool_and_float(value: Any) -> Any:
    # ``Literal[1]`` alone compares by equality, so JSON ``true`` and ``1.0`` would pass as version 1.
    if isinstance(value, bool | float):
        raise ValueError("schema_version must be the integer 1")
    return value


def _date_time_text(value: Any) -> Any:
    # ``AwareDatetime`` alone accepts a Unix timestamp number; the contract asks for RFC 3339 text.
    if isinstance(value, int | float):
        raise ValueError("must be an RFC 3339 date-time string")
    if isinstance(value, str) and len(value) > MAX_DATE_TIME:
        raise ValueError(f"must be at most {MAX_DATE_TIME} characters")
    return value


InboundSchemaVersion = Annotated[Literal[1], BeforeValidator(_reject_bool_and_float)]
Rfc3339 = Annotated[
    AwareDatetime, BeforeValidator(_date_time_text), Field(json_schema_extra={"maxLength": MAX_DATE_TIME})
]
#: ``event_id`` as the worker takes it: a UUID in its canonical text form only.
EventId = Annotated[
    UUID,
    BeforeValidator(_canonical_uuid),
    Field(json_schema_extra={"pattern": CANONICAL_UUID, "maxLength": 36}),
]
ToolCallId = Annotated[
    StrictStr,
    Field(
        max_length=MAX_TOOL_CALL_ID_BYTES,
        pattern=NO_NUL,
        description=f"at most {MAX_TOOL_CALL_ID_BYTES} bytes in UTF-8 (the result's AMQP correlation_id)",
    ),
    AfterValidator(_fits_short_string),
]
Int4 = Annotated[StrictInt, Field(ge=0, le=MAX_INT4)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
