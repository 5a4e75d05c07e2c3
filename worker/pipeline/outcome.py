"""What one event ends as: a status with its sentence and data.

Every sentence here is the original bot's, verbatim (reference section 1.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from contracts.models import (
    SAVED_MESSAGE,
    DeadLetterKind,
    ServerStateInvalidation,
    Status,
    ToolResult,
    UserInvalidation,
)

SERVER_WIDE = "server_wide"
TARGET_USER = "target_user"

Invalidation = ServerStateInvalidation | UserInvalidation


class EventIds(Protocol):
    """What a result needs to know of its event: a :class:`ToolCallEvent`, or the ids a shard can still be
    answered by when the rest of the envelope is broken (:class:`worker.broker.envelope.RoutableIds`)."""

    @property
    def event_id(self) -> UUID: ...

    @property
    def tool_call_id(self) -> str: ...

    @property
    def tool_name(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Outcome:
    """The decision for one event: the result's status, sentence and data (a save's notice and invalidation
    travel with its :class:`~worker.pipeline.plan.SavePlan`)."""

    status: Status
    error: str | None
    data: dict[str, Any]
    memory_id: int | None = None
    scope: str | None = None

    @property
    def success(self) -> bool:
        return self.status == Status.SAVED

    def result(self, ids: EventIds, processed_at: datetime) -> ToolResult:
        """The tool result message of CONTRACT.md for this outcome, answering the event ``ids`` names (a
        replay is answered from the ledger's copy instead: :mod:`worker.service.process`)."""
        return ToolResult(
            event_id=ids.event_id,
            tool_call_id=ids.tool_call_id,
            tool_name=ids.tool_name,
            success=self.success,
            status=self.status,
            message=SAVED_MESSAGE if self.success else None,
            error=self.error,
            data=self.data,
            processed_at=processed_at,
        )


def failure(status: Status, error: str, reason: str | None = None, **data: Any) -> Outcome:
    """A failed outcome; ``data.reason`` defaults to the error sentence, as most original branches do."""
    return Outcome(status=status, error=error, data={"status": status, **data, "reason": reason or error})


# Step 1 and 4: arguments
def invalid_arguments(sentence: str) -> Outcome:
    return failure(Status.INVALID_ARGS, sentence)


CONTENT_MISSING = "The 'memory_content' argument was missing, empty, or not a string"
TARGET_MISSING = "The 'target_user' argument is required when 'memory_scope' is 'target_user'."


def content_missing() -> Outcome:
    return failure(Status.INVALID_ARGS, CONTENT_MISSING)


def target_missing() -> Outcome:
    return failure(Status.INVALID_ARGS, TARGET_MISSING, scope=TARGET_USER)


# Step 2
def disabled() -> Outcome:
    return failure(
        Status.DISABLED,
        "Self-teaching is disabled for this server",
        "Self-teaching functionality is disabled for this server",
    )


# Step 3
CRITICAL_STATE_MISSING = "Internal bot error: Critical state information is missing"


def critical_state_missing() -> Outcome:
    return failure(Status.INTERNAL_ERROR, CRITICAL_STATE_MISSING)


# Step 5: the target
def ambiguous_user(input_text: str, labels: tuple[str, ...]) -> Outcome:
    shown = list(labels[:3])
    return failure(
        Status.AMBIGUOUS_USER,
        f'Multiple users match "{input_text}". Please clarify which one you mean: {", ".join(shown)}.',
        "Multiple users matched the requested target.",
        scope=TARGET_USER,
        candidates=shown,
    )


def user_not_found(input_text: str) -> Outcome:
    return failure(
        Status.USER_NOT_FOUND,
        f'Could not find a user matching "{input_text}" in this conversation or server.',
        "The requested user was not found in this conversation or server.",
        scope=TARGET_USER,
    )


# Step 7
def content_too_long(max_length: int) -> Outcome:
    return failure(
        Status.INVALID_CONTENT,
        f"Memory content is too long. Maximum length is {max_length} characters.",
        f"Memory content exceeds maximum length of {max_length} characters",
    )


def content_empty() -> Outcome:
    return failure(Status.INVALID_CONTENT, "Memory content cannot be empty")


# Step 8
def lineage_zero() -> Outcome:
    return failure(
        Status.INTERNAL_ERROR,
        "Internal configuration error: this persona has an invalid lineage ID.",
        "Persona lineage ID is 0, which is reserved for global memories. Schema migration may not have run.",
    )


# Step 9: server-wide branch
def server_limit_reached(count: int, max_allowed: int) -> Outcome:
    return failure(
        Status.LIMIT_EXCEEDED,
        f"Server memory limit reached. This server can have up to {max_allowed} memories "
        f"(currently: {count}).",
        f"Server memory limit of {max_allowed} memories has been reached. Please inform the user that they "
        "need to use '/memories' to remove some memories before I can learn new ones.",
        scope=SERVER_WIDE,
        current_count=count,
        max_allowed=max_allowed,
    )


# Step 10: personal branch
def target_unknown(label: str) -> Outcome:
    return failure(
        Status.USER_NOT_FOUND,
        f"I don't know {label} yet, so I cannot save a personal memory for them.",
        "I can only save personal memories for users I already know.",
        scope=TARGET_USER,
    )


def privacy_restricted(name: str) -> Outcome:
    return failure(
        Status.PRIVACY_RESTRICTED,
        f"Cannot save personal memory: {name} has privacy restrictions.",
        f"The user {name} has chosen to restrict personal memory storage. I cannot save personal memories "
        "about them unless they change their privacy settings using '/personal config'.",
        scope=TARGET_USER,
    )


def personal_limit_reached(name: str, count: int, max_allowed: int) -> Outcome:
    return failure(
        Status.LIMIT_EXCEEDED,
        f"Personal memory limit reached. Users can have up to {max_allowed} personal memories "
        f"(currently: {count}).",
        f"Personal memory limit of {max_allowed} memories has been reached for this user. Please inform the "
        "user that they need to use '/personal memories' to remove some of their memories before I can "
        "learn new ones about them.",
        scope=TARGET_USER,
        target_user=name,
        current_count=count,
        max_allowed=max_allowed,
    )


# Failures that are not the pipeline's verdict (dead letters, CONTRACT.md)
def database_error() -> Outcome:
    """Sent with a ``transient_exhausted`` dead letter: the database never became available."""
    return failure(Status.DB_ERROR, "Database error occurred while saving memory", "Database error occurred")


INTERNAL_ERROR = "Internal bot error: the memory could not be processed"
#: ``data.reason`` of a dead letter's failure result, by kind: what went wrong is in the dead letter's
#: ``x-ltm-error`` and the worker's log, never in what the model reads (no exception or validator text)
DEAD_LETTER_REASONS: dict[DeadLetterKind, str] = {
    DeadLetterKind.SCHEMA: "The tool call event breaks the worker's contract; an operator will look at it.",
    DeadLetterKind.INTERNAL: "The worker failed unexpectedly on this event; an operator will look at it.",
    DeadLetterKind.UNVERIFIED_SHARD: "The tool call event names a shard its sender may not speak for; "
    "nothing was saved, and an operator will look at it.",
    DeadLetterKind.SHARD_BACKLOG_FULL: "Too many memory requests of this shard are waiting; nothing was "
    "saved. Try again later.",
}


def internal_error(kind: DeadLetterKind) -> Outcome:
    """Sent with a ``schema``, ``internal``, ``unverified_shard`` or ``shard_backlog_full`` dead letter
    (``kind``) whose ids could still be read."""
    return failure(Status.INTERNAL_ERROR, INTERNAL_ERROR, DEAD_LETTER_REASONS[kind])


EVENT_CONFLICT_REASON = (
    "event_id conflict: this event_id was already used by a different event; nothing was saved. "
    "Send every tool call with a new event_id."
)


def event_conflict() -> Outcome:
    """Sent with an ``event_conflict`` dead letter: the ``event_id`` is in the ledger for a different event
    (another tool call, shard, scope or content). Says nothing of that event (CONTRACT.md section 4)."""
    return failure(Status.INTERNAL_ERROR, INTERNAL_ERROR, EVENT_CONFLICT_REASON)
