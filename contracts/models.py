"""Wire models of CONTRACT.md, version 1.

Strict about the envelope (types are not coerced: ``"3"`` is not a shard id), lenient about
``arguments`` (any JSON value, judged later by the pipeline) and about unknown keys (ignored).
These models do no I/O and import nothing from the worker: a shard author reads only this package.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, NotRequired
from uuid import UUID

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
)
from pydantic.dataclasses import dataclass as pydantic_dataclass
from typing_extensions import TypedDict  # pydantic reads only this TypedDict on Python 3.11

SCHEMA_VERSION = 1

#: Routing/tool names a shard may use for this tool (the alias stays the alias in the result).
TOOL_NAMES = ("create_long_term_memory", "remember_this_fact")
ToolName = Literal["create_long_term_memory", "remember_this_fact"]

#: AMQP ``type`` property of each message kind.
EVENT_TYPE = "tool_call.v1"
RESULT_TYPE = "tool_result.v1"
NOTIFICATION_TYPE = "notification.v1"

ShardQueueKind = Literal["results", "notifications"]


def shard_queue(shard_id: int, kind: ShardQueueKind) -> str:
    """The durable queue shard ``shard_id`` declares and binds with ``shard.<id>`` (contracts/CONTRACT.md).

    ``results`` is bound to ``tomori.tool_results``, ``notifications`` to ``tomori.notifications``.
    """
    return f"tomori.shard.{shard_id}.{kind}"


#: A body larger than this is dead-lettered as ``schema`` without being parsed.
MAX_BODY_BYTES = 256 * 1024
MAX_GUILD_MEMBERS = 1000

DiscordId = Annotated[StrictStr, Field(pattern=r"^[0-9]{17,20}$", description="Discord snowflake")]


def _reject_bool_and_float(value: Any) -> Any:
    # ``Literal[1]`` alone compares by equality, so JSON ``true`` and ``1.0`` would pass as version 1.
    if isinstance(value, bool | float):
        raise ValueError("schema_version must be the integer 1")
    return value


def _reject_number(value: Any) -> Any:
    # ``AwareDatetime`` alone accepts a Unix timestamp number; the contract asks for RFC 3339 text.
    if isinstance(value, int | float):
        raise ValueError("must be an RFC 3339 date-time string")
    return value


InboundSchemaVersion = Annotated[Literal[1], BeforeValidator(_reject_bool_and_float)]
Rfc3339 = Annotated[AwareDatetime, BeforeValidator(_reject_number)]


class Status(StrEnum):
    """A tool result's ``status``: one per way an event can end (SPEC.md, reference 1.3)."""

    SAVED = "memory_saved_successfully"
    INVALID_ARGS = "memory_save_failed_invalid_args"
    INVALID_CONTENT = "memory_save_failed_invalid_content"
    DISABLED = "memory_save_failed_disabled"
    LIMIT_EXCEEDED = "memory_save_failed_limit_exceeded"
    AMBIGUOUS_USER = "memory_save_failed_ambiguous_user"
    USER_NOT_FOUND = "memory_save_failed_user_not_found"
    PRIVACY_RESTRICTED = "memory_save_failed_privacy_restricted"
    INTERNAL_ERROR = "memory_save_failed_internal_error"
    DB_ERROR = "memory_save_failed_db_error"


#: ``message`` of a successful result (``null`` on failure, when ``error`` holds the sentence).
SAVED_MESSAGE = "Memory saved successfully"


class DeadLetterKind(StrEnum):
    """``x-ltm-error-kind`` of a dead letter the worker writes (CONTRACT.md "Dead letters")."""

    MALFORMED = "malformed"
    SCHEMA = "schema"
    TRANSIENT_EXHAUSTED = "transient_exhausted"
    INTERNAL = "internal"
    #: the event's ``event_id`` is in the ledger for a different event (CONTRACT.md "Dead letters")
    EVENT_CONFLICT = "event_conflict"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ReplyVia(_Model):
    """Deliver the notice through this webhook (an alter persona) instead of the channel."""

    webhook_disc_id: StrictStr
    username: StrictStr
    avatar_url: StrictStr | None = None


# The two lists of an event (dozens of members) are pydantic dataclasses, not models: validated the same,
# built at half the cost (the envelope's parse is a tenth of the worker's CPU; these lists most of it).
_ITEM_CONFIG = ConfigDict(extra="ignore")


@pydantic_dataclass(frozen=True, config=_ITEM_CONFIG)
class Participant:
    """One of the conversation's tool-target references."""

    target_id: StrictStr
    display_label: StrictStr
    aliases: list[StrictStr] = Field(default_factory=list)
    is_bridge: StrictBool = False


@pydantic_dataclass(frozen=True, config=_ITEM_CONFIG)
class GuildMember:
    """A guild member the shard knows; the worker's only view of the guild."""

    user_disc_id: DiscordId
    username: StrictStr
    global_name: StrictStr | None = None
    nickname: StrictStr | None = None
    is_bot: StrictBool = False


class EventContext(_Model):
    guild_disc_id: DiscordId | None = None
    channel_disc_id: DiscordId
    thread_id: DiscordId | None = None
    triggering_user_disc_id: DiscordId | None = None
    bot_user_disc_id: DiscordId
    persona_id: StrictInt
    reply_via: ReplyVia | None = None
    participants: list[Participant] = Field(default_factory=list)
    guild_members: list[GuildMember] = Field(default_factory=list, max_length=MAX_GUILD_MEMBERS)


class ToolCallEvent(_Model):
    """Shard -> worker: the model called ``create_long_term_memory`` (or its alias)."""

    schema_version: InboundSchemaVersion
    event_id: UUID
    tool_call_id: StrictStr
    tool_name: ToolName
    issued_at: Rfc3339
    shard_id: Annotated[StrictInt, Field(ge=0)]
    #: The model's arguments, verbatim and untrusted: any JSON value (``null`` when absent).
    arguments: Any = None
    context: EventContext


class ToolResult(_Model):
    """Worker -> shard: exactly one logical result per event (may be re-emitted with ``replayed``)."""

    schema_version: Literal[1] = 1
    event_id: UUID
    tool_call_id: StrictStr
    tool_name: StrictStr
    success: StrictBool
    status: Status
    message: StrictStr | None
    error: StrictStr | None
    data: dict[str, Any]
    processed_at: datetime
    replayed: StrictBool = False


# The ``data`` of a tool result, per status: exactly the keys the worker writes (SPEC.md, reference 1.3).
# Keys marked NotRequired appear only in some branches of one status. ``ToolResult.data`` stays a plain dict
# for the worker; these types describe it for the JSON Schema and for shard authors.


class SavedServerWideData(TypedDict):
    """``memory_saved_successfully``: a server-wide memory was saved."""

    status: Literal["memory_saved_successfully"]
    scope: Literal["server_wide"]
    memory_id: int
    content_saved: str


class SavedTargetUserData(TypedDict):
    """``memory_saved_successfully``: a personal memory about ``target_user`` was saved."""

    status: Literal["memory_saved_successfully"]
    scope: Literal["target_user"]
    target_user: str
    memory_id: int
    content_saved: str


class InvalidArgsData(TypedDict):
    """``memory_save_failed_invalid_args``; ``scope`` only when a target_user scope lacked its target."""

    status: Literal["memory_save_failed_invalid_args"]
    scope: NotRequired[Literal["target_user"]]
    reason: str


class InvalidContentData(TypedDict):
    """``memory_save_failed_invalid_content``: empty or too long after sanitising."""

    status: Literal["memory_save_failed_invalid_content"]
    reason: str


class DisabledData(TypedDict):
    """``memory_save_failed_disabled``: self-teaching is off for the server."""

    status: Literal["memory_save_failed_disabled"]
    reason: str


class ServerLimitExceededData(TypedDict):
    """``memory_save_failed_limit_exceeded`` for the server-wide scope."""

    status: Literal["memory_save_failed_limit_exceeded"]
    scope: Literal["server_wide"]
    current_count: int
    max_allowed: int
    reason: str


class PersonalLimitExceededData(TypedDict):
    """``memory_save_failed_limit_exceeded`` for a personal memory about ``target_user``."""

    status: Literal["memory_save_failed_limit_exceeded"]
    scope: Literal["target_user"]
    target_user: str
    current_count: int
    max_allowed: int
    reason: str


class AmbiguousUserData(TypedDict):
    """``memory_save_failed_ambiguous_user``: up to three candidate labels."""

    status: Literal["memory_save_failed_ambiguous_user"]
    scope: Literal["target_user"]
    candidates: Annotated[list[str], Field(max_length=3)]
    reason: str


class UserNotFoundData(TypedDict):
    """``memory_save_failed_user_not_found``: no such user, or one the bot does not know yet."""

    status: Literal["memory_save_failed_user_not_found"]
    scope: Literal["target_user"]
    reason: str


class PrivacyRestrictedData(TypedDict):
    """``memory_save_failed_privacy_restricted``: the target restricts personal memories."""

    status: Literal["memory_save_failed_privacy_restricted"]
    scope: Literal["target_user"]
    reason: str


class InternalErrorData(TypedDict):
    """``memory_save_failed_internal_error``: missing state, lineage 0, or a dead letter's answer."""

    status: Literal["memory_save_failed_internal_error"]
    reason: str


class DbErrorData(TypedDict):
    """``memory_save_failed_db_error``: the database stayed unavailable through every retry."""

    status: Literal["memory_save_failed_db_error"]
    reason: str


#: Every ``data`` shape, by the status it goes with (the order of :data:`Status`).
RESULT_DATA: dict[Status, tuple[type, ...]] = {
    Status.SAVED: (SavedServerWideData, SavedTargetUserData),
    Status.INVALID_ARGS: (InvalidArgsData,),
    Status.INVALID_CONTENT: (InvalidContentData,),
    Status.DISABLED: (DisabledData,),
    Status.LIMIT_EXCEEDED: (ServerLimitExceededData, PersonalLimitExceededData),
    Status.AMBIGUOUS_USER: (AmbiguousUserData,),
    Status.USER_NOT_FOUND: (UserNotFoundData,),
    Status.PRIVACY_RESTRICTED: (PrivacyRestrictedData,),
    Status.INTERNAL_ERROR: (InternalErrorData,),
    Status.DB_ERROR: (DbErrorData,),
}


class Notice(_Model):
    kind: Literal["server_memory", "personal_memory"]
    title: StrictStr
    description: StrictStr
    footer: StrictStr
    accent_color: StrictStr = "#2ECC71"
    full_content: StrictStr
    expandable: StrictBool


class Notification(_Model):
    """Worker -> shard, after a successful save only."""

    schema_version: Literal[1] = 1
    event_id: UUID
    guild_disc_id: StrictStr | None
    channel_disc_id: StrictStr
    thread_id: StrictStr | None
    reply_via: ReplyVia | None
    notice: Notice


def invalidation_id(event_id: UUID) -> str:
    """The ``invalidation_id`` of the invalidations a save of ``event_id`` publishes (CONTRACT.md section 6).

    Hex SHA-256 of ``"tomori-ltm-invalidation:"`` and the event id in its canonical text form: the same on
    every re-emit, recomputable by the shard that sent the event, and no way back to the ``event_id``
    (which the ledger answers by)."""
    return hashlib.sha256(f"tomori-ltm-invalidation:{event_id}".encode()).hexdigest()


InvalidationId = Annotated[
    StrictStr,
    Field(
        pattern=r"^[0-9a-f]{64}$",
        description="opaque id of the save (hex SHA-256 of 'tomori-ltm-invalidation:' + event_id), "
        "the same on every re-emit; never the event_id",
    ),
]


class ServerStateInvalidation(_Model):
    """Redis: drop the cached server state after a server-wide save."""

    schema_version: Literal[1] = 1
    invalidation_id: InvalidationId
    kind: Literal["tomori_state"] = "tomori_state"
    server_disc_id: StrictStr


class UserInvalidation(_Model):
    """Redis: drop the cached user after a personal save (the target's Discord id)."""

    schema_version: Literal[1] = 1
    invalidation_id: InvalidationId
    kind: Literal["user"] = "user"
    user_disc_id: StrictStr


# pydantic picks the class by ``kind``; the JSON Schema spells it as plain ``oneOf`` + ``const``
CacheInvalidation = Annotated[ServerStateInvalidation | UserInvalidation, Field(discriminator="kind")]


class DeadLetterHeaders(_Model):
    """Headers the worker adds to a message it moves to ``ltm.create_memory.dlq``."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    error: StrictStr = Field(alias="x-ltm-error", description="one line, human readable")
    error_kind: DeadLetterKind = Field(alias="x-ltm-error-kind")
    attempts: Annotated[StrictInt, Field(ge=1)] = Field(alias="x-ltm-attempts")
    failed_at: AwareDatetime = Field(alias="x-ltm-failed-at", description="RFC 3339")
