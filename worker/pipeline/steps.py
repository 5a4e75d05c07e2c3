"""The steps of SPEC.md for one event, in order, first failure wins.

Pure: the state arrives as :class:`LoadedState`, the decision leaves as a value. Everything except the
count-and-insert (which must happen under the scope lock, in the store) is decided here:
:func:`decide` returns either the final :class:`Outcome` or a :class:`SavePlan` that the unit of work
completes with :func:`saved` or :func:`limit_reached`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contracts.models import (
    GuildMember,
    Notification,
    ServerStateInvalidation,
    Status,
    ToolCallEvent,
    UserInvalidation,
    invalidation_id,
)
from worker.config import Limits
from worker.pipeline import outcome
from worker.pipeline.arguments import legacy_type_error, target_string, validate_arguments
from worker.pipeline.naming import member_display_name
from worker.pipeline.notice import personal_footer, personal_notice, render_for_display, server_notice
from worker.pipeline.outcome import Outcome
from worker.pipeline.resolver import Ambiguous, NotFound, Resolved, resolve_target
from worker.pipeline.state import (
    PRIVACY_FULL,
    PRIVACY_PARTIAL,
    LoadedState,
    PersonaState,
    ServerState,
    UserRecord,
)
from worker.pipeline.text import js_trim, sanitize_placeholders, utf16_length

_MATRIX_SUFFIX = re.compile(r"\s+\(Matrix\)$")


@dataclass(frozen=True, slots=True)
class SavePlan:
    """A memory that passed every rule but the limit: what to lock, count and insert.

    ``scope`` is ``server_wide`` (owner = the internal server id) or ``target_user`` (owner = the target's
    internal user id). The notification and invalidation are ready; only the memory id is missing.
    """

    scope: str
    owner_id: int
    lineage_id: int
    content: str
    persona_id: int | None
    author_user_id: int | None
    target_label: str | None
    notification: Notification
    invalidation: ServerStateInvalidation | UserInvalidation


def decide(event: ToolCallEvent, state: LoadedState, limits: Limits) -> Outcome | SavePlan:
    """Run steps 1 to 8 and the checks of step 9/10 that come before the count."""
    ctx = event.context
    # 1. arguments
    args = validate_arguments(event.arguments)
    if isinstance(args, str):
        return outcome.invalid_arguments(args)
    # 2. self-teaching flag (a missing flags row means enabled)
    if state.server is not None and not state.server.self_teaching_enabled:
        return outcome.disabled()
    # 3. critical state
    trigger_id = ctx.triggering_user_disc_id
    author = state.users.get(trigger_id) if trigger_id else None
    if state.server is None or state.persona is None or author is None:
        return outcome.critical_state_missing()
    server, persona = state.server, state.persona
    # 4. content present
    raw_content = args.content
    if not js_trim(raw_content):
        return outcome.content_missing()
    # 5. the target
    scope = args.scope
    target: Resolved | None = None
    if scope == outcome.TARGET_USER:
        type_error = legacy_type_error(args, js_trim)
        if type_error is not None:
            return outcome.invalid_arguments(type_error)
        wanted = target_string(args, js_trim)
        if wanted is None:
            return outcome.target_missing()
        found = resolve_target(wanted, ctx, persona, state.users)
        if isinstance(found, Ambiguous):
            return outcome.ambiguous_user(wanted, found.candidates)
        if isinstance(found, NotFound):
            return outcome.user_not_found(wanted)
        if found.target_id == ctx.bot_user_disc_id or wanted.lower() == "self":
            scope = outcome.SERVER_WIDE
        elif found.is_bridge:
            bridge_name = _MATRIX_SUFFIX.sub("", found.label)
            raw_content = raw_content.replace("{user}", bridge_name)
            scope = outcome.SERVER_WIDE
        else:
            target = found
    # 6. content finalisation; 7. length
    content = sanitize_placeholders(js_trim(raw_content))
    if not js_trim(content):
        return outcome.content_empty()
    if utf16_length(content) > limits.max_memory_length:
        return outcome.content_too_long(limits.max_memory_length)
    # 8. lineage 0 is reserved for global memories
    if persona.lineage_id == 0:
        return outcome.lineage_zero()
    members = {m.user_disc_id: m for m in ctx.guild_members}
    title_name = (ctx.reply_via.username if ctx.reply_via else "") or persona.nickname
    if target is None:
        return _server_plan(event, content, server, persona, author, members, state, title_name, limits)
    # 10. personal branch, before the count
    subject = state.users.get(target.target_id)
    if subject is None:
        return outcome.target_unknown(target.label)
    if subject.privacy_level in (PRIVACY_PARTIAL, PRIVACY_FULL):
        return outcome.privacy_restricted(target.label)
    rendered = render_for_display(
        content,
        user_name=target.label,
        bot_nickname=persona.nickname,
        bot_user_disc_id=ctx.bot_user_disc_id,
        users=state.users,
        members=members,
        personal_memories_enabled=server.personal_memories_enabled,
    )
    footer = personal_footer(
        personal_memories_enabled=server.personal_memories_enabled, target_blacklisted=subject.blacklisted
    )
    notice = personal_notice(
        title_name=title_name,
        target_label=target.label,
        rendered_content=rendered,
        footer=footer,
        preview_limit=limits.notice_preview_limit,
    )
    return SavePlan(
        scope=outcome.TARGET_USER,
        owner_id=subject.user_id,
        lineage_id=persona.lineage_id,
        content=content,
        persona_id=None,
        author_user_id=None,
        target_label=target.label,
        notification=_notification(event, notice),
        invalidation=UserInvalidation(
            invalidation_id=invalidation_id(event.event_id), user_disc_id=target.target_id
        ),
    )


def missing_state(event: ToolCallEvent, state: LoadedState) -> list[str]:
    """What step 3 found missing, in words for the operator's log (the model is told only the original's
    sentence, ``outcome.CRITICAL_STATE_MISSING``); empty when nothing is."""
    ctx = event.context
    missing: list[str] = []
    if state.server is None:
        if ctx.guild_disc_id:
            missing.append(f"no servers row for guild {ctx.guild_disc_id}")
        elif ctx.triggering_user_disc_id:
            missing.append(f"no servers row for the DM of user {ctx.triggering_user_disc_id}")
        else:
            missing.append("no server: a DM event without triggering_user_disc_id")
    if state.persona is None:
        missing.append(f"no personas row with persona_id {ctx.persona_id} on that server")
    trigger_id = ctx.triggering_user_disc_id
    if not trigger_id:
        missing.append("no author: the event's triggering_user_disc_id is null")
    elif trigger_id not in state.users:
        missing.append(f"no users row for the author {trigger_id}")
    return missing


def _server_plan(
    event: ToolCallEvent,
    content: str,
    server: ServerState,
    persona: PersonaState,
    author: UserRecord,
    members: Mapping[str, GuildMember],
    state: LoadedState,
    title_name: str,
    limits: Limits,
) -> SavePlan:
    ctx = event.context
    rendered = render_for_display(
        content,
        user_name=_author_name(event, author, members),
        bot_nickname=persona.nickname,
        bot_user_disc_id=ctx.bot_user_disc_id,
        users=state.users,
        members=members,
        personal_memories_enabled=server.personal_memories_enabled,
    )
    notice = server_notice(
        title_name=title_name, rendered_content=rendered, preview_limit=limits.notice_preview_limit
    )
    return SavePlan(
        scope=outcome.SERVER_WIDE,
        owner_id=server.server_id,
        lineage_id=persona.lineage_id,
        content=content,
        persona_id=persona.persona_id,
        author_user_id=author.user_id,
        target_label=None,
        notification=_notification(event, notice),
        invalidation=ServerStateInvalidation(
            invalidation_id=invalidation_id(event.event_id),
            # in a DM the "server" is the triggering user (the original's memoryServerDiscId)
            server_disc_id=ctx.guild_disc_id or author.user_disc_id,
        ),
    )


def _author_name(event: ToolCallEvent, author: UserRecord, members: Mapping[str, GuildMember]) -> str:
    """``{user}`` in a server notice: saved nickname, else display name from the event, else the id."""
    if author.nickname:
        return author.nickname
    member = members.get(author.user_disc_id)
    if member is not None:
        return member_display_name(member)
    for participant in event.context.participants:
        if participant.target_id == author.user_disc_id and participant.display_label:
            return participant.display_label
    return author.user_disc_id


def _notification(event: ToolCallEvent, notice: Any) -> Notification:
    ctx = event.context
    return Notification(
        event_id=event.event_id,
        guild_disc_id=ctx.guild_disc_id,
        channel_disc_id=ctx.channel_disc_id,
        thread_id=ctx.thread_id,
        reply_via=ctx.reply_via,
        notice=notice,
    )


def max_for(plan: SavePlan, limits: Limits) -> int:
    """The limit that applies to the plan's scope."""
    if plan.scope == outcome.SERVER_WIDE:
        return limits.max_server_memories
    return limits.max_personal_memories


def limit_reached(plan: SavePlan, count: int, limits: Limits) -> Outcome:
    """The limit-exceeded outcome for a scope that already holds ``count`` >= its maximum rows."""
    max_allowed = max_for(plan, limits)
    if plan.scope == outcome.SERVER_WIDE:
        return outcome.server_limit_reached(count, max_allowed)
    return outcome.personal_limit_reached(plan.target_label or "", count, max_allowed)


def saved(plan: SavePlan, memory_id: int | None) -> Outcome:
    """The success outcome of ``plan``, its row inserted as ``memory_id``.

    ``None`` is the ledger's copy that goes with the write, before the row exists: its ``data`` has no
    ``memory_id``, which the database writes in as it draws the id (``ltm_save_event``, migration 0004).
    """
    data: dict[str, Any] = {"status": Status.SAVED, "scope": plan.scope}
    if plan.scope == outcome.TARGET_USER:
        data["target_user"] = plan.target_label
    if memory_id is not None:
        data["memory_id"] = memory_id
    data["content_saved"] = plan.content
    return Outcome(
        status=Status.SAVED,
        error=None,
        data=data,
        memory_id=memory_id,
        scope=plan.scope,
        notification=plan.notification,
        invalidation=plan.invalidation,
    )
