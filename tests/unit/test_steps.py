"""The steps over values: what :func:`decide` plans for a save, the notice rendered from that plan, the users
the state must hold, and the limits (no database: the integration tests run the same rules in Postgres)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contracts.models import ServerStateInvalidation, Status, UserInvalidation, invalidation_id
from tests.factories import BOT, GUILD, TRIGGER, event, member, participant
from worker.config import Limits
from worker.pipeline import outcome
from worker.pipeline.limits import (
    DEFAULT_MAX_MEMORY_LENGTH,
    DEFAULT_MAX_PERSONAL_MEMORIES,
    DEFAULT_MAX_SERVER_MEMORIES,
    DEFAULT_NOTICE_PREVIEW_LIMIT,
    MemoryLimits,
    limit_reached,
    max_for,
    too_long,
)
from worker.pipeline.notice import PERSONAL_MEMORY_FOOTER_USER_BLACKLISTED, SERVER_MEMORY_FOOTER, notice_for
from worker.pipeline.plan import SavePlan
from worker.pipeline.state import LoadedState, PersonaState, ServerState, UserRecord
from worker.pipeline.steps import decide, saved, users_needed

SPARROW = "1150000000000000300"
MENTIONED = "1150000000000000400"
SERVER = ServerState(server_id=11, server_disc_id=GUILD)
PERSONA = PersonaState(persona_id=7, nickname="Tomori", lineage_id=10000)
AUTHOR = UserRecord(user_id=21, user_disc_id=TRIGGER, nickname="Robin")


@dataclass(frozen=True)
class SmallLimits:
    """Limits as another caller may hold them: anything with the four values is a :class:`MemoryLimits`."""

    max_server_memories: int = 2
    max_personal_memories: int = 3
    max_memory_length: int = 4
    notice_preview_limit: int = 5


def state(*users: UserRecord, server: ServerState = SERVER) -> LoadedState:
    return LoadedState(server=server, persona=PERSONA, users={u.user_disc_id: u for u in (AUTHOR, *users)})


def plan_for(arguments: dict[str, Any], loaded: LoadedState, **kwargs: Any) -> SavePlan:
    decision = decide(event(arguments, persona_id=PERSONA.persona_id, **kwargs), loaded, Limits())
    assert isinstance(decision, SavePlan)
    return decision


def test_a_server_wide_plan_is_owned_by_the_server_and_written_by_the_author() -> None:
    ev = event({"memory_content": " {user} likes dogs ", "memory_scope": "server_wide"}, persona_id=7)

    plan = decide(ev, state(), Limits())

    assert isinstance(plan, SavePlan)
    assert (plan.scope, plan.content, plan.target, plan.target_label) == (
        "server_wide",
        "{user} likes dogs",
        None,
        None,
    )
    assert (plan.owner_id, plan.lineage_id, plan.persona_id, plan.author_user_id) == (11, 10000, 7, 21)
    assert plan.author == AUTHOR
    assert plan.invalidation == ServerStateInvalidation(
        invalidation_id=invalidation_id(ev.event_id), server_disc_id=GUILD
    )


def test_a_personal_plan_is_owned_by_the_target_and_records_no_author_or_persona() -> None:
    sparrow = UserRecord(user_id=31, user_disc_id=SPARROW)
    ev = event(
        {"memory_content": "{user} likes cats", "memory_scope": "target_user", "target_user": "Sparrow"},
        persona_id=7,
        members=[member(SPARROW, "sparrow_ow", "Sparrow")],
    )

    plan = decide(ev, state(sparrow), Limits())

    assert isinstance(plan, SavePlan)
    assert plan.target is not None
    assert plan.target.user == sparrow
    assert (plan.scope, plan.target_label) == ("target_user", "Sparrow (@sparrow_ow)")
    assert (plan.owner_id, plan.lineage_id, plan.persona_id, plan.author_user_id) == (31, 10000, None, None)
    assert plan.invalidation == UserInvalidation(
        invalidation_id=invalidation_id(ev.event_id), user_disc_id=SPARROW
    )


def test_in_a_direct_message_the_server_invalidated_is_the_author() -> None:
    plan = plan_for({"memory_content": "x", "memory_scope": "server_wide"}, state(), guild=None)

    assert isinstance(plan.invalidation, ServerStateInvalidation)
    assert plan.invalidation.server_disc_id == TRIGGER


def test_the_server_notice_names_the_author_and_the_reply_name() -> None:
    mentioned = UserRecord(user_id=41, user_disc_id=MENTIONED, nickname="Wren")
    ev = event(
        {"memory_content": f"{{user}} and <@{MENTIONED}> like {{bot}}", "memory_scope": "server_wide"},
        persona_id=7,
        reply_via={"webhook_disc_id": "1150000000000000500", "username": "Alt", "avatar_url": None},
    )
    plan = decide(ev, state(mentioned), Limits())
    assert isinstance(plan, SavePlan)

    notification = notice_for(plan, ev, state(mentioned).users, DEFAULT_NOTICE_PREVIEW_LIMIT)

    assert (notification.event_id, notification.guild_disc_id) == (ev.event_id, GUILD)
    assert notification.channel_disc_id == ev.context.channel_disc_id
    assert notification.reply_via == ev.context.reply_via
    assert notification.notice.kind == "server_memory"
    assert notification.notice.title == "🧠 Alt Learned Something New!"
    assert notification.notice.full_content == "Robin and Wren like Tomori"
    assert notification.notice.footer == SERVER_MEMORY_FOOTER


def test_without_a_saved_nickname_the_server_notice_names_the_author_as_the_guild_shows_them() -> None:
    author = UserRecord(user_id=21, user_disc_id=TRIGGER)
    loaded = LoadedState(server=SERVER, persona=PERSONA, users={TRIGGER: author})
    ev = event(
        {"memory_content": "{user} likes dogs", "memory_scope": "server_wide"},
        persona_id=7,
        members=[member(TRIGGER, "robin_r", "Robin R", nickname="Rob")],
    )
    plan = decide(ev, loaded, Limits())
    assert isinstance(plan, SavePlan)

    assert notice_for(plan, ev, loaded.users, 600).notice.full_content == "Rob likes dogs"


def test_the_personal_notice_names_the_target_and_says_they_are_blacklisted() -> None:
    sparrow = UserRecord(user_id=31, user_disc_id=SPARROW, blacklisted=True)
    ev = event(
        {"memory_content": "{user} likes cats", "memory_scope": "target_user", "target_user": "Sparrow"},
        persona_id=7,
        members=[member(SPARROW, "sparrow_ow", "Sparrow")],
    )
    plan = decide(ev, state(sparrow), Limits())
    assert isinstance(plan, SavePlan)

    notice = notice_for(plan, ev, state(sparrow).users, 5).notice

    assert notice.kind == "personal_memory"
    assert notice.title == "💡 Tomori Learned Something New about Sparrow (@sparrow_ow)!"
    assert notice.full_content == "Sparrow (@sparrow_ow) likes cats"
    assert notice.footer == PERSONAL_MEMORY_FOOTER_USER_BLACKLISTED
    assert notice.expandable  # the preview limit given is the one applied


def test_the_saved_outcome_comes_from_the_plan() -> None:
    plan = plan_for({"memory_content": "x", "memory_scope": "server_wide"}, state())

    final = saved(plan, 5)

    assert (final.status, final.memory_id, final.scope) == (Status.SAVED, 5, "server_wide")
    assert final.data == {
        "status": Status.SAVED,
        "scope": "server_wide",
        "memory_id": 5,
        "content_saved": "x",
    }
    assert "memory_id" not in saved(plan, None).data


def test_users_needed_for_a_server_wide_save_are_the_author_and_the_mentioned() -> None:
    ev = event(
        {"memory_content": f"<@{MENTIONED}> and <@!{SPARROW}> <#{BOT}>", "memory_scope": "server_wide"},
        persona_id=7,
        members=[member("1150000000000000600", "m")],
        participants=[participant("1150000000000000700", "P", [])],
    )

    assert users_needed(ev) == {TRIGGER, MENTIONED, SPARROW}


def test_users_needed_for_a_personal_save_add_whom_the_resolver_may_pick() -> None:
    ev = event(
        {"memory_content": "x", "memory_scope": "target_user", "target_user": "m"},
        persona_id=7,
        trigger=None,
        members=[member("1150000000000000600", "m")],
        participants=[participant("1150000000000000700", "P", [])],
    )

    assert users_needed(ev) == {"1150000000000000600", "1150000000000000700"}


def test_users_needed_for_unreadable_arguments_is_only_the_author() -> None:
    assert users_needed(event(["not", "an", "object"], persona_id=7)) == {TRIGGER}
    assert users_needed(event({"memory_content": 5, "memory_scope": "server_wide"}, persona_id=7)) == {
        TRIGGER
    }


def test_the_length_limit_counts_utf16_units() -> None:
    limits = SmallLimits(max_memory_length=4)

    assert too_long("abcd", limits) is None
    assert too_long("abc😀", limits) == outcome.content_too_long(4)  # the emoji is two units
    decision = decide(
        event({"memory_content": "abc😀", "memory_scope": "server_wide"}, persona_id=7), state(), limits
    )
    assert decision == outcome.content_too_long(4)


def test_each_scope_has_its_own_maximum_and_limit_outcome() -> None:
    limits = SmallLimits()
    server_wide = plan_for({"memory_content": "x", "memory_scope": "server_wide"}, state())
    personal = plan_for(
        {"memory_content": "x", "memory_scope": "target_user", "target_user": "sparrow"},
        state(UserRecord(user_id=31, user_disc_id=SPARROW)),
        members=[member(SPARROW, "sparrow")],
    )

    assert (max_for(server_wide, limits), max_for(personal, limits)) == (2, 3)
    assert limit_reached(server_wide, 2, limits) == outcome.server_limit_reached(2, 2)
    assert limit_reached(personal, 4, limits) == outcome.personal_limit_reached("sparrow", 4, 3)


def test_the_settings_defaults_are_the_pipelines() -> None:
    settings: MemoryLimits = Limits()

    assert (
        settings.max_server_memories,
        settings.max_personal_memories,
        settings.max_memory_length,
        settings.notice_preview_limit,
    ) == (
        DEFAULT_MAX_SERVER_MEMORIES,
        DEFAULT_MAX_PERSONAL_MEMORIES,
        DEFAULT_MAX_MEMORY_LENGTH,
        DEFAULT_NOTICE_PREVIEW_LIMIT,
    )
