"""Wire models of CONTRACT.md, version 1.

Strict about the envelope (types are not coerced: ``"3"`` is not a shard id), lenient about
``arguments`` (any JSON value, judged later by the pipeline) and about unknown keys (ignored).
These models do no I/O and import nothing from the worker: a shard author reads only this package.

Every name is importable from here; each module holds one part of the contract:

- :mod:`~contracts.models.fields`: the message types and tool names, the bounds of every list and string,
  the annotated field types and the models' common base;
- :mod:`~contracts.models.tool`: the tool the model calls (description, parameters, its ``arguments``);
- :mod:`~contracts.models.events`: shard -> worker, the tool-call event and its ``context``;
- :mod:`~contracts.models.results`: worker -> shard, the result with its ``data`` per status, and the
  notification with its notice;
- :mod:`~contracts.models.invalidations`: worker -> Redis, the cache invalidations;
- :mod:`~contracts.models.dead_letters`: the dead letters' kinds and headers;
- the shard's queues (``ShardQueueKind``, ``shard_queue``) are named in :mod:`contracts.names` with the
  contract's other names.
"""

from contracts.models.dead_letters import (
    DeadLetterHeaders,
    DeadLetterKind,
)
from contracts.models.events import (
    EventContext,
    GuildMember,
    Participant,
    ReplyVia,
    ToolCallEvent,
)
from contracts.models.fields import (
    CANONICAL_UUID,
    EVENT_TYPE,
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
    NO_NUL,
    NOTIFICATION_TYPE,
    RESULT_TYPE,
    SCHEMA_VERSION,
    TOOL_NAMES,
    AvatarUrl,
    DiscordId,
    DiscordName,
    EventId,
    InboundSchemaVersion,
    Int4,
    Label,
    Rfc3339,
    TargetId,
    ToolCallId,
    ToolName,
    WebhookUsername,
)
from contracts.models.invalidations import (
    CacheInvalidation,
    InvalidationId,
    ServerStateInvalidation,
    UserInvalidation,
    invalidation_id,
)
from contracts.models.results import (
    EMBED_TOTAL_LIMIT,
    NOTICE_DESCRIPTION_LIMIT,
    NOTICE_FOOTER_LIMIT,
    NOTICE_FULL_CONTENT_LIMIT,
    NOTICE_TITLE_LIMIT,
    RESULT_DATA,
    SAVED_MESSAGE,
    AmbiguousUserData,
    DbErrorData,
    DisabledData,
    InternalErrorData,
    InvalidArgsData,
    InvalidContentData,
    Notice,
    Notification,
    PersonalLimitExceededData,
    PrivacyRestrictedData,
    SavedServerWideData,
    SavedTargetUserData,
    ServerLimitExceededData,
    Status,
    ToolResult,
    UserNotFoundData,
)
from contracts.models.tool import (
    TOOL_DESCRIPTION,
    TOOL_PARAMETERS,
    CreateMemoryArguments,
    MemoryScope,
    tool_declaration,
)
from contracts.names import (
    ShardQueueKind,
    shard_queue,
)

__all__ = [
    "CANONICAL_UUID",
    "EMBED_TOTAL_LIMIT",
    "EVENT_TYPE",
    "MAX_ALIASES",
    "MAX_AVATAR_URL",
    "MAX_BODY_BYTES",
    "MAX_DATE_TIME",
    "MAX_DISCORD_NAME",
    "MAX_GUILD_MEMBERS",
    "MAX_INT4",
    "MAX_LABEL",
    "MAX_PARTICIPANTS",
    "MAX_TARGET_ID",
    "MAX_TOOL_CALL_ID_BYTES",
    "MAX_WEBHOOK_USERNAME",
    "NOTICE_DESCRIPTION_LIMIT",
    "NOTICE_FOOTER_LIMIT",
    "NOTICE_FULL_CONTENT_LIMIT",
    "NOTICE_TITLE_LIMIT",
    "NOTIFICATION_TYPE",
    "NO_NUL",
    "RESULT_DATA",
    "RESULT_TYPE",
    "SAVED_MESSAGE",
    "SCHEMA_VERSION",
    "TOOL_DESCRIPTION",
    "TOOL_NAMES",
    "TOOL_PARAMETERS",
    "AmbiguousUserData",
    "AvatarUrl",
    "CacheInvalidation",
    "CreateMemoryArguments",
    "DbErrorData",
    "DeadLetterHeaders",
    "DeadLetterKind",
    "DisabledData",
    "DiscordId",
    "DiscordName",
    "EventContext",
    "EventId",
    "GuildMember",
    "InboundSchemaVersion",
    "Int4",
    "InternalErrorData",
    "InvalidArgsData",
    "InvalidContentData",
    "InvalidationId",
    "Label",
    "MemoryScope",
    "Notice",
    "Notification",
    "Participant",
    "PersonalLimitExceededData",
    "PrivacyRestrictedData",
    "ReplyVia",
    "Rfc3339",
    "SavedServerWideData",
    "SavedTargetUserData",
    "ServerLimitExceededData",
    "ServerStateInvalidation",
    "ShardQueueKind",
    "Status",
    "TargetId",
    "ToolCallEvent",
    "ToolCallId",
    "ToolName",
    "ToolResult",
    "UserInvalidation",
    "UserNotFoundData",
    "WebhookUsername",
    "invalidation_id",
    "shard_queue",
    "tool_declaration",
]
