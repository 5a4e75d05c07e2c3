"""The steps of SPEC.md for one event, in order, first failure wins.

Pure: the state arrives as :class:`LoadedState`, the decision leaves as a value. Everything except the
count-and-insert (which must happen under the scope lock, in the store) is decided here:
:func:`decide` returns either the final :class:`Outcome` or a :class:`SavePlan`, which the service renders
the notice of (:func:`worker.pipeline.notice.notice_for`), writes under the scope's limit
(:mod:`worker.pipeline.limits`), and answers with :func:`saved` or :func:`limits.limit_reached`.
:func:`users_needed` says which users the state must hold.
"""

from __future__ import annotations

import re
from typing import Any

from contracts.models import ServerStateInvalidation, Status, ToolCallEvent, UserInvalidation, invalidation_id
from worker.pipeline import outcome
from worker.pipeline.arguments import legacy_type_error, target_string, validate_arguments
from worker.pipeline.limits import MemoryLimits, too_long
from worker.pipeline.notice import mentioned_user_ids
from worker.pipeline.outcome import Outcome
from worker.pipeline.plan import SavePlan, Target
from worker.pipeline.resolver import Ambiguous, NotFound, Resolved, resolve_target
from worker.pipeline.state import PRIVACY_FULL, PRIVACY_PARTIAL, LoadedState
from worker.pipeline.text import js_trim, sanitize_placeholders

_MATRIX_SUFFIX = re.compile(r"\s+\(Matrix\)$")


def decide(event: ToolCallEvent, state: LoadedState, limits: MemoryLimits) -> Outcome | SavePlan:
    """Run steps 1 to 8 and the checks of step 9/10 that come before the count: the outcome of the first
    rule that fails, else the plan of the save (the target, the author and the content to save)."""
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
    longer = too_long(content, limits)
    if longer is not None:
        return longer
    # 8. lineage 0 is reserved for global memories
    if persona.lineage_id == 0:
        return outcome.lineage_zero()
    # 9. server-wide branch, before the count
    if target is None:
        # in a DM the "server" is the triggering user (the original's memoryServerDiscId)
        server_disc_id = ctx.guild_disc_id or author.user_disc_id
        server_wide = ServerStateInvalidation(
            invalidation_id=invalidation_id(event.event_id), server_disc_id=server_disc_id
        )
        return SavePlan(content, server, persona, author, None, server_wide)
    # 10. personal branch, before the count
    subject = state.users.get(target.target_id)
    if subject is None:
        return outcome.target_unknown(target.label)
    if subject.privacy_level in (PRIVACY_PARTIAL, PRIVACY_FULL):
        return outcome.privacy_restricted(target.label)
    personal = UserInvalidation(
        invalidation_id=invalidation_id(event.event_id), user_disc_id=target.target_id
    )
    return SavePlan(content, server, persona, author, Target(target.label, subject), personal)


def users_needed(event: ToolCallEvent) -> set[str]:
    """The Discord ids of every user :func:`decide` and the notice may look up, so the state holds their rows:
    the trigger and the users mentioned in the content, and for a ``target_user`` save the guild members and
    participants the resolver may pick from."""
    ctx = event.context
    arguments = event.arguments if isinstance(event.arguments, dict) else {}
    ids: set[str] = set()
    if arguments.get("memory_scope") == outcome.TARGET_USER:
        ids.update(m.user_disc_id for m in ctx.guild_members)
        ids.update(p.target_id for p in ctx.participants)
    if ctx.triggering_user_disc_id:
        ids.add(ctx.triggering_user_disc_id)
    content = arguments.get("memory_content")
    if isinstance(content, str):
        ids.update(mentioned_user_ids(content))
    return ids


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
    return Outcome(status=Status.SAVED, error=None, data=data, memory_id=memory_id, scope=plan.scope)
