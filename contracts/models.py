"""Wire models of CONTRACT.md, version 1.

Strict about the envelope (types are not coerced: ``"3"`` is not a shard id), lenient about
``arguments`` (any JSON value, judged later by the pipeline) and about unknown keys (ignored).
These models do no I/O and import nothing from the worker: a shard author reads only this package.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, NotRequired
from uuid import UUID

from pydantic import (
    AfterValidator,
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

from contracts import names

# the shard's queues, named in contracts/names.py with the contract's other names
from contracts.names import ShardQueueKind as ShardQueueKind
from contracts.names import shard_queue as shard_queue

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
    #: the RabbitMQ user that published the event may not speak for its ``shard_id`` (CONTRACT.md section 2)
    UNVERIFIED_SHARD = "unverified_shard"
    #: the event's shard already had its bound of events waiting; it was not processed (CONTRACT.md section 2)
    SHARD_BACKLOG_FULL = "shard_backlog_full"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ReplyVia(_Model):
    """Deliver the notice through this webhook (an alter persona) instead of the channel."""

    webhook_disc_id: DiscordId
    username: WebhookUsername
    avatar_url: AvatarUrl | None = None


# The two lists of an event (dozens of members) are pydantic dataclasses, not models: validated the same,
# built at half the cost (the envelope's parse is a tenth of the worker's CPU; these lists most of it).
_ITEM_CONFIG = ConfigDict(extra="ignore")


@pydantic_dataclass(frozen=True, config=_ITEM_CONFIG)
class Participant:
    """One of the conversation's tool-target references."""

    target_id: TargetId
    display_label: Label
    aliases: list[Label] = Field(default_factory=list, max_length=MAX_ALIASES)
    is_bridge: StrictBool = False


@pydantic_dataclass(frozen=True, config=_ITEM_CONFIG)
class GuildMember:
    """A guild member the shard knows; the worker's only view of the guild."""

    user_disc_id: DiscordId
    username: DiscordName
    global_name: DiscordName | None = None
    nickname: DiscordName | None = None
    is_bot: StrictBool = False


class EventContext(_Model):
    guild_disc_id: DiscordId | None = None
    channel_disc_id: DiscordId
    thread_id: DiscordId | None = None
    triggering_user_disc_id: DiscordId | None = None
    bot_user_disc_id: DiscordId
    persona_id: Int4
    reply_via: ReplyVia | None = None
    participants: list[Participant] = Field(default_factory=list, max_length=MAX_PARTICIPANTS)
    guild_members: list[GuildMember] = Field(default_factory=list, max_length=MAX_GUILD_MEMBERS)

    @property
    def tenant(self) -> str:
        """Whom the turns inside a shard are shared among (CONTRACT.md section 2, "Fair shares"): the guild,
        or for a direct message its channel, ``dm:<channel_disc_id>``."""
        return self.guild_disc_id if self.guild_disc_id is not None else f"dm:{self.channel_disc_id}"


#: The tool the model calls: its name and description, the original bot's verbatim (CONTRACT.md section 3).
TOOL_DESCRIPTION = (
    "Use this function when you identify a new, distinct piece of information, fact, preference, or "
    "instruction during the conversation that seems important to remember for future interactions. This "
    "helps you learn and adapt. Specify if the information is a general server-wide fact or something "
    "specific about a user. Avoid saving information that is already known or redundant. IMPORTANT: Use "
    "{bot} instead of hardcoded bot names and {user} instead of hardcoded user names in your memory content "
    "to prevent confusion when names change. Be proactive in remembering user or server preferences, "
    "interests, and facts. Do not wait for the user to ask you to remember things and be proactive but "
    "avoid saving PII (real names, addresses, and contact info)"
)
#: the parameters the model is shown, with the original's descriptions, in the original's order
TOOL_PARAMETERS: dict[str, str] = {
    "memory_content": "The specific piece of information, fact, or preference to remember. Be concise and "
    "clear. Write in third-person. Use {user} to refer to the target user and {bot} to refer to yourself; "
    "never hardcode names. Example: '{user} likes dogs' or '{bot} should greet {user} formally'.",
    "memory_scope": "Specify the scope of this memory. Use 'server_wide' for general information applicable "
    "to the whole server, or 'target_user' for information specific to a particular user.",
    "target_user": "If memory_scope is 'target_user', provide the target user's name as shown in the current "
    "conversation or server. Use natural names, not IDs.",
}
MemoryScope = Literal["server_wide", "target_user"]


class CreateMemoryArguments(TypedDict):
    """The `arguments` of a create_long_term_memory tool call as the model writes them: `memory_content`
    and `memory_scope` always, and for `target_user` the person's name as the conversation shows it
    (`target_user`). The worker reads the arguments verbatim and judges them (a wrong shape is answered
    memory_save_failed_invalid_args, CONTRACT.md section 4), ignoring keys it does not know; the model's
    tool declaration (create_long_term_memory.tool.json) lists the first three keys only.
    `target_user_nickname` and `target_user_discord_id` are the bot's legacy names for the target, still
    read (the first non-empty of `target_user`, `target_user_nickname`, `target_user_discord_id` is the
    target); a shard does not need them."""

    memory_content: Annotated[str, Field(description=TOOL_PARAMETERS["memory_content"])]
    memory_scope: Annotated[MemoryScope, Field(description=TOOL_PARAMETERS["memory_scope"])]
    target_user: NotRequired[Annotated[str, Field(description=TOOL_PARAMETERS["target_user"])]]
    target_user_nickname: NotRequired[Annotated[str, Field(description="Legacy name of target_user.")]]
    target_user_discord_id: NotRequired[
        Annotated[str, Field(description="Legacy: the target's Discord id (the model is told to use names).")]
    ]


def tool_declaration() -> dict[str, Any]:
    """The model's tool declaration (name, description, JSON Schema of the parameters), as the original bot
    declares it: the shape function-calling APIs take, with the original's texts."""
    return {
        "name": TOOL_NAMES[0],
        "description": TOOL_DESCRIPTION,
        "parameters": {
            "type": "object",
            "properties": {
                "memory_content": {"type": "string", "description": TOOL_PARAMETERS["memory_content"]},
                "memory_scope": {
                    "type": "string",
                    "enum": ["server_wide", "target_user"],
                    "description": TOOL_PARAMETERS["memory_scope"],
                },
                "target_user": {"type": "string", "description": TOOL_PARAMETERS["target_user"]},
            },
            "required": ["memory_content", "memory_scope"],
        },
    }


class ToolCallEvent(_Model):
    """Shard -> worker: the model called ``create_long_term_memory`` (or its alias)."""

    schema_version: InboundSchemaVersion
    event_id: EventId
    tool_call_id: ToolCallId
    tool_name: ToolName
    issued_at: Rfc3339
    shard_id: Int4
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


# Discord's embed limits, which bound the notice (CONTRACT.md "Notification"): a shard shows it as an embed
# (title, description, footer) and "Show Full Memory" as an embed whose description is ``full_content`` in a
# code fence. Counted in characters (code points), as JSON Schema's maxLength is.
NOTICE_TITLE_LIMIT = 256
NOTICE_DESCRIPTION_LIMIT = 4096
NOTICE_FOOTER_LIMIT = 2048
#: title, description and footer of one embed together
EMBED_TOTAL_LIMIT = 6000
#: the "Show Full Memory" embed's description is ``"```\n" + full_content + "\n```"``
NOTICE_FULL_CONTENT_LIMIT = NOTICE_DESCRIPTION_LIMIT - len("```\n\n```")


class Notice(_Model):
    kind: Literal["server_memory", "personal_memory"]
    title: Annotated[StrictStr, Field(max_length=NOTICE_TITLE_LIMIT)]
    description: Annotated[StrictStr, Field(max_length=NOTICE_DESCRIPTION_LIMIT)]
    footer: Annotated[StrictStr, Field(max_length=NOTICE_FOOTER_LIMIT)]
    accent_color: StrictStr = "#2ECC71"
    full_content: Annotated[StrictStr, Field(max_length=NOTICE_FULL_CONTENT_LIMIT)]
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

    error: StrictStr = Field(alias=names.ERROR_HEADER, description="one line, human readable")
    error_kind: DeadLetterKind = Field(alias=names.ERROR_KIND_HEADER)
    attempts: Annotated[StrictInt, Field(ge=1)] = Field(alias=names.ATTEMPTS_HEADER)
    failed_at: AwareDatetime = Field(alias=names.FAILED_AT_HEADER, description="RFC 3339")
