"""Worker -> shard: the tool result (its ``status``, and the ``data`` each status carries) and, after a
successful save only, the notification with its notice, bounded by Discord's embed limits.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, NotRequired
from uuid import UUID

from pydantic import Field, StrictBool, StrictStr
from typing_extensions import TypedDict  # pydantic reads only this TypedDict on Python 3.11

from contracts.models.events import ReplyVia
from contracts.models.fields import _Model


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
