"""The target-user stage ladder: every stage resolving, going ambiguous and finding nobody."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from contracts.models import EventContext, GuildMember, Participant
from worker.pipeline.resolver import Ambiguous, NotFound, Resolution, Resolved, resolve_target
from worker.pipeline.state import NamingConfig, PersonaState, UserRecord

GUILD_ID = "1150000000000000001"
SPARROW = "1150000000000000201"
OBONYA = "1150000000000000202"
MISUZU = "1150000000000000203"
KAITO = "1150000000000000204"
BOT = "1150000000000000999"
ALICE = "@alice:matrix.org"

PLAIN_PERSONA = PersonaState(persona_id=7, nickname="Tomori", lineage_id=10000)


def member(
    disc_id: str,
    username: str,
    global_name: str | None = None,
    nickname: str | None = None,
    is_bot: bool = False,
) -> GuildMember:
    return GuildMember(
        user_disc_id=disc_id, username=username, global_name=global_name, nickname=nickname, is_bot=is_bot
    )


def participant(target_id: str, label: str, *aliases: str, is_bridge: bool = False) -> Participant:
    return Participant(target_id=target_id, display_label=label, aliases=list(aliases), is_bridge=is_bridge)


def context(
    members: Sequence[GuildMember] = (), participants: Sequence[Participant] = (), in_guild: bool = True
) -> EventContext:
    return EventContext(
        guild_disc_id=GUILD_ID if in_guild else None,
        channel_disc_id="1150000000000000100",
        triggering_user_disc_id=SPARROW,
        bot_user_disc_id=BOT,
        persona_id=7,
        participants=list(participants),
        guild_members=list(members),
    )


def record(disc_id: str, **fields: Any) -> UserRecord:
    return UserRecord(user_id=int(disc_id[-3:]), user_disc_id=disc_id, **fields)


def users_of(*records: UserRecord) -> dict[str, UserRecord]:
    return {r.user_disc_id: r for r in records}


def resolve(
    raw: str,
    ctx: EventContext,
    users: Mapping[str, UserRecord] | None = None,
    persona: PersonaState = PLAIN_PERSONA,
) -> Resolution:
    return resolve_target(raw, ctx, persona, users or {})


def persona_with(
    prefixes: dict[str, str] | None = None, suffixes: dict[str, str] | None = None
) -> PersonaState:
    naming = NamingConfig(prefixes=prefixes or {}, suffixes=suffixes or {})
    return PersonaState(persona_id=7, nickname="Tomori", lineage_id=10000, naming=naming)


# --- empty input -------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", ["", "   ", "@@@", " @ \u3000"])
def test_empty_target_is_not_found(raw: str) -> None:
    assert resolve(raw, context([member(SPARROW, "sparrow")])) == NotFound()


# --- stage 0: bridge id ------------------------------------------------------------------------


def test_bridge_id_of_a_participant_resolves_with_the_matrix_label() -> None:
    ctx = context(participants=[participant(ALICE, "Alice", "Alice", is_bridge=True)])
    assert resolve(f"  {ALICE} ", ctx) == Resolved(ALICE, "Alice (Matrix)", True, "legacy_id")


def test_bridge_id_resolves_in_a_dm_too() -> None:
    ctx = context(participants=[participant(ALICE, "Alice", is_bridge=True)], in_guild=False)
    assert resolve(ALICE, ctx) == Resolved(ALICE, "Alice (Matrix)", True, "legacy_id")


def test_bridge_id_takes_bridge_status_from_the_participant_flag() -> None:
    ctx = context(participants=[participant(ALICE, "Alice", "Alice", is_bridge=False)])
    assert resolve(ALICE, ctx) == Resolved(ALICE, "Alice", False, "legacy_id")


def test_unknown_bridge_id_falls_through_to_the_conversation_aliases() -> None:
    ctx = context(participants=[participant("@bob:matrix.org", "Bob", "alice:matrix.org", is_bridge=True)])
    assert resolve(ALICE, ctx) == Resolved("@bob:matrix.org", "Bob (Matrix)", True, "conversation")


def test_unknown_bridge_id_is_not_found() -> None:
    assert resolve(ALICE, context([member(SPARROW, "sparrow")])) == NotFound()


# --- stage 1: bare Discord id ------------------------------------------------------------------


def test_discord_id_of_a_guild_member_resolves_with_the_member_label() -> None:
    ctx = context([member(SPARROW, "sparrow_ow", "Sparrow")])
    assert resolve(f" {SPARROW} ", ctx) == Resolved(SPARROW, "Sparrow (@sparrow_ow)", False, "legacy_id")


def test_discord_id_of_a_participant_outside_the_guild_list_resolves_with_its_label() -> None:
    ctx = context(participants=[participant(SPARROW, "Master Sparrow", "Sparrow")])
    assert resolve(SPARROW, ctx) == Resolved(SPARROW, "Master Sparrow", False, "legacy_id")


def test_discord_id_of_a_bridge_participant_keeps_the_participant_flag_and_label() -> None:
    ctx = context(participants=[participant(SPARROW, "Relay", is_bridge=True)])
    assert resolve(SPARROW, ctx) == Resolved(SPARROW, "Relay (Matrix)", True, "legacy_id")


def test_discord_id_of_a_bot_member_is_not_taken_from_the_guild() -> None:
    ctx = context([member(BOT, "tomori", is_bot=True)])
    assert resolve(BOT, ctx) == NotFound()


def test_discord_id_of_a_bot_member_may_still_match_a_participant() -> None:
    ctx = context([member(BOT, "tomori", is_bot=True)], [participant(BOT, "Tomori")])
    assert resolve(BOT, ctx) == Resolved(BOT, "Tomori", False, "legacy_id")


def test_discord_id_in_a_dm_ignores_the_guild_member_list() -> None:
    ctx = context([member(SPARROW, "sparrow")], in_guild=False)
    assert resolve(SPARROW, ctx) == NotFound()


def test_unknown_discord_id_stops_the_ladder() -> None:
    # A member whose username is the very same digits would match the username stage: never reached.
    ctx = context([member(OBONYA, SPARROW)], [participant(OBONYA, "Obonya", SPARROW)])
    assert resolve(SPARROW, ctx) == NotFound()


@pytest.mark.parametrize("digits", ["1234567890123456", "123456789012345678901", "١١٥٠٠٠٠٠٠٠٠٠٠٠٠٠٢٠١"])
def test_digits_that_are_not_a_snowflake_go_down_the_name_ladder(digits: str) -> None:
    ctx = context([member(SPARROW, digits)])
    assert resolve(digits, ctx) == Resolved(SPARROW, digits, False, "guild_display_name")


# --- stage 2: conversation ---------------------------------------------------------------------


def test_conversation_alias_resolves_after_normalisation() -> None:
    ctx = context(participants=[participant(SPARROW, "Master Sparrow", "Sparrow", "sparrow_ow")])
    assert resolve("  @SPARROW_ow ", ctx) == Resolved(SPARROW, "Master Sparrow", False, "conversation")


def test_conversation_does_not_match_the_display_label_alone() -> None:
    ctx = context(participants=[participant(SPARROW, "Master Sparrow", "Sparrow")], in_guild=False)
    assert resolve("Master Sparrow", ctx) == NotFound()


def test_conversation_bridge_alias_resolves_with_the_matrix_label() -> None:
    ctx = context(participants=[participant(ALICE, "Alice", "Alice", is_bridge=True)])
    assert resolve("alice", ctx) == Resolved(ALICE, "Alice (Matrix)", True, "conversation")


def test_conversation_prefers_the_one_participant_whose_own_label_is_the_name() -> None:
    ctx = context(
        participants=[
            participant(MISUZU, "Misuzu", "Misuzu", "Obonya"),
            participant(OBONYA, "Obonya", "Obonya", "obonya_dev"),
        ]
    )
    assert resolve("Obonya", ctx) == Resolved(OBONYA, "Obonya", False, "conversation")


def test_conversation_with_two_participants_labelled_alike_is_ambiguous() -> None:
    ctx = context(
        participants=[participant(MISUZU, "Obonya", "Obonya"), participant(OBONYA, "Obonya", "Obonya")]
    )
    assert resolve("obonya", ctx) == Ambiguous(("Obonya", "Obonya"))


def test_conversation_alias_shared_without_a_label_match_is_ambiguous() -> None:
    ctx = context(
        participants=[
            participant(SPARROW, "Sparrow", "Sparrow", "Cap"),
            participant(ALICE, "Alice", "Alice", "Cap", is_bridge=True),
        ]
    )
    assert resolve("cap", ctx) == Ambiguous(("Sparrow", "Alice (Matrix)"))


def test_conversation_dedupes_participants_by_target_id() -> None:
    ctx = context(
        participants=[participant(SPARROW, "Sparrow", "Cap"), participant(SPARROW, "Sparrow again", "Cap")]
    )
    assert resolve("Cap", ctx) == Resolved(SPARROW, "Sparrow", False, "conversation")


def test_conversation_ambiguity_lists_at_most_three_labels_in_participant_order() -> None:
    ids = [SPARROW, OBONYA, MISUZU, KAITO]
    ctx = context(participants=[participant(i, f"User {n}", "Cap") for n, i in enumerate(ids)])
    assert resolve("Cap", ctx) == Ambiguous(("User 0", "User 1", "User 2"))


def test_conversation_wins_over_the_guild() -> None:
    ctx = context([member(OBONYA, "cap")], [participant(SPARROW, "Sparrow", "Cap")])
    assert resolve("Cap", ctx) == Resolved(SPARROW, "Sparrow", False, "conversation")


# --- stage 3: no guild -------------------------------------------------------------------------


def test_dm_stops_after_the_conversation_stage() -> None:
    ctx = context([member(SPARROW, "sparrow")], in_guild=False)
    assert resolve("sparrow", ctx, users_of(record(SPARROW, nickname="Sparrow"))) == NotFound()


# --- stage 4: name ladder ----------------------------------------------------------------------


def test_guild_display_name_resolves_by_nickname() -> None:
    ctx = context([member(SPARROW, "sparrow_ow", "Sparrow", "Cap")])
    assert resolve("@cap", ctx) == Resolved(SPARROW, "Cap (@sparrow_ow)", False, "guild_display_name")


def test_guild_display_name_falls_back_to_global_name_then_username() -> None:
    ctx = context([member(SPARROW, "sparrow_ow", "Sparrow"), member(OBONYA, "obonya")])
    assert resolve("Sparrow", ctx) == Resolved(SPARROW, "Sparrow (@sparrow_ow)", False, "guild_display_name")
    assert resolve("OBONYA", ctx) == Resolved(OBONYA, "obonya", False, "guild_display_name")


def test_persona_nickname_resolves_a_guild_member() -> None:
    ctx = context([member(SPARROW, "sparrow_ow", "Sparrow")])
    users = users_of(record(SPARROW, persona_nickname="Birdie", nickname="Spa"))
    assert resolve("birdie", ctx, users) == Resolved(
        SPARROW, "Sparrow (@sparrow_ow)", False, "persona_nickname"
    )


def test_saved_nickname_resolves_a_guild_member() -> None:
    ctx = context([member(SPARROW, "sparrow_ow", "Sparrow")])
    users = users_of(record(SPARROW, nickname="  Spa  "))
    assert resolve("spa", ctx, users) == Resolved(SPARROW, "Sparrow (@sparrow_ow)", False, "db_nickname")


def test_global_name_resolves_when_a_guild_nickname_hides_it() -> None:
    ctx = context([member(SPARROW, "sparrow_ow", "Sparrow", "Cap")])
    assert resolve("sparrow", ctx) == Resolved(SPARROW, "Cap (@sparrow_ow)", False, "global_name")


def test_username_resolves_when_other_names_hide_it() -> None:
    ctx = context([member(SPARROW, "sparrow_ow", "Sparrow", "Cap")])
    assert resolve("@sparrow_ow", ctx) == Resolved(SPARROW, "Cap (@sparrow_ow)", False, "username")


def test_database_stages_only_count_guild_members() -> None:
    ctx = context([member(SPARROW, "sparrow_ow")])
    users = users_of(record(OBONYA, persona_nickname="Obo", nickname="Obo"))
    assert resolve("Obo", ctx, users) == NotFound()


def test_bots_are_never_name_candidates() -> None:
    ctx = context([member(BOT, "tomori", "Tomori", is_bot=True)])
    assert resolve("Tomori", ctx) == NotFound()


def test_a_bot_sharing_a_name_does_not_make_it_ambiguous() -> None:
    ctx = context([member(BOT, "tomori", "Tomori", is_bot=True), member(SPARROW, "tomori_fan", "Tomori")])
    assert resolve("Tomori", ctx) == Resolved(SPARROW, "Tomori (@tomori_fan)", False, "guild_display_name")


def test_earlier_stage_wins_over_a_later_one() -> None:
    ctx = context([member(SPARROW, "sparrow_ow", "Obo"), member(OBONYA, "obonya")])
    users = users_of(record(OBONYA, persona_nickname="Obo"))
    assert resolve("Obo", ctx, users) == Resolved(SPARROW, "Obo (@sparrow_ow)", False, "guild_display_name")


def test_persona_nickname_wins_over_saved_nickname() -> None:
    ctx = context([member(SPARROW, "sparrow_ow"), member(OBONYA, "obonya")])
    users = users_of(record(SPARROW, nickname="Obo"), record(OBONYA, persona_nickname="Obo"))
    assert resolve("Obo", ctx, users) == Resolved(OBONYA, "obonya", False, "persona_nickname")


def test_duplicate_member_entries_count_once() -> None:
    ctx = context([member(SPARROW, "sparrow_ow", "Cap"), member(SPARROW, "sparrow_ow", "Cap")])
    assert resolve("Cap", ctx) == Resolved(SPARROW, "Cap (@sparrow_ow)", False, "guild_display_name")


@pytest.mark.parametrize(
    ("members", "users"),
    [
        pytest.param([member(SPARROW, "a", "Cap"), member(OBONYA, "b", None, "cap")], {}, id="guild_display"),
        pytest.param(
            [member(SPARROW, "a"), member(OBONYA, "b")],
            users_of(record(SPARROW, persona_nickname="Cap"), record(OBONYA, persona_nickname="CAP")),
            id="persona_nickname",
        ),
        pytest.param(
            [member(SPARROW, "a"), member(OBONYA, "b")],
            users_of(record(SPARROW, nickname="Cap"), record(OBONYA, nickname="cap")),
            id="db_nickname",
        ),
        pytest.param(
            [member(SPARROW, "a", "Cap", "X"), member(OBONYA, "b", "Cap", "Y")], {}, id="global_name"
        ),
        pytest.param(
            [member(SPARROW, "cap", None, "X"), member(OBONYA, "Cap", None, "Y")], {}, id="username"
        ),
    ],
)
def test_two_members_in_one_stage_are_ambiguous(
    members: list[GuildMember], users: dict[str, UserRecord]
) -> None:
    result = resolve("Cap", context(members), users)
    assert isinstance(result, Ambiguous)
    assert len(result.candidates) == 2


def test_guild_ambiguity_lists_at_most_three_member_labels_in_guild_order() -> None:
    ids = [KAITO, SPARROW, OBONYA, MISUZU]
    ctx = context([member(i, f"user{n}", "Cap") for n, i in enumerate(ids)])
    assert resolve("Cap", ctx) == Ambiguous(("Cap (@user0)", "Cap (@user1)", "Cap (@user2)"))


def test_unknown_name_in_a_guild_is_not_found() -> None:
    assert resolve("Nobody", context([member(SPARROW, "sparrow_ow", "Sparrow")])) == NotFound()


# --- stage 5: persona affixes stripped ---------------------------------------------------------


def test_persona_prefix_is_stripped_before_the_ladder_runs_again() -> None:
    ctx = context([member(SPARROW, "sparrow_ow", "Sparrow")])
    persona = persona_with({"neutral": "Master"})
    assert resolve("Master Sparrow", ctx, persona=persona) == Resolved(
        SPARROW, "Sparrow (@sparrow_ow)", False, "guild_display_name"
    )


def test_persona_suffix_is_stripped_before_the_ladder_runs_again() -> None:
    ctx = context([member(OBONYA, "obonya", "Obonya")])
    persona = persona_with(suffixes={"neutral": "-chan"})
    assert resolve("Obonya-chan", ctx, persona=persona) == Resolved(
        OBONYA, "Obonya", False, "guild_display_name"
    )


def test_persona_prefix_is_stripped_without_a_word_boundary() -> None:
    ctx = context([member(SPARROW, "son")])
    persona = persona_with({"neutral": "Master"})
    assert resolve("Masterson", ctx, persona=persona) == Resolved(SPARROW, "son", False, "guild_display_name")


def test_stripped_name_reaches_the_database_stages() -> None:
    ctx = context([member(SPARROW, "sparrow_ow")])
    users = users_of(record(SPARROW, nickname="Obo"))
    persona = persona_with({"feminine": "Lady"})
    assert resolve("Lady Obo", ctx, users, persona) == Resolved(SPARROW, "sparrow_ow", False, "db_nickname")


def test_full_name_matches_before_the_affix_is_stripped() -> None:
    ctx = context([member(SPARROW, "sparrow_ow", "Sparrow"), member(OBONYA, "obonya", "Master Sparrow")])
    persona = persona_with({"neutral": "Master"})
    assert resolve("Master Sparrow", ctx, persona=persona) == Resolved(
        OBONYA, "Master Sparrow (@obonya)", False, "guild_display_name"
    )


def test_stripped_name_shared_by_two_members_is_ambiguous() -> None:
    ctx = context([member(SPARROW, "a", "Sparrow"), member(OBONYA, "b", "Sparrow")])
    persona = persona_with({"neutral": "Master"})
    assert resolve("Master Sparrow", ctx, persona=persona) == Ambiguous(("Sparrow (@a)", "Sparrow (@b)"))


def test_stripped_name_nobody_has_is_not_found() -> None:
    ctx = context([member(SPARROW, "sparrow_ow", "Sparrow")])
    assert resolve("Master Nobody", ctx, persona=persona_with({"neutral": "Master"})) == NotFound()


# --- stage 6: composed names -------------------------------------------------------------------


def test_users_own_prefix_override_composes_a_name() -> None:
    ctx = context([member(OBONYA, "obonya_dev", "Obonya")])
    users = users_of(record(OBONYA, has_personalization=True, nickname="Obo", prefix_override="Master"))
    assert resolve("Master Obo", ctx, users) == Resolved(
        OBONYA, "Obonya (@obonya_dev)", False, "composed_name"
    )


def test_composed_name_without_the_users_prefix_is_not_found() -> None:
    ctx = context([member(OBONYA, "obonya_dev", "Obonya")])
    users = users_of(record(OBONYA, has_personalization=True, nickname="Obo"))
    assert resolve("Master Obo", ctx, users) == NotFound()


def test_composed_name_needs_a_personalization_row() -> None:
    ctx = context([member(OBONYA, "obonya_dev", "Obonya")])
    users = users_of(record(OBONYA, has_personalization=False, nickname="Obo", prefix_override="Master"))
    assert resolve("Master Obo", ctx, users) == NotFound()


def test_composed_name_joins_a_cjk_suffix_without_a_space() -> None:
    ctx = context([member(OBONYA, "obonya_dev", "Obonya")])
    users = users_of(record(OBONYA, has_personalization=True, nickname="Obo", suffix_override="さん"))
    assert resolve("Oboさん", ctx, users) == Resolved(OBONYA, "Obonya (@obonya_dev)", False, "composed_name")
    assert resolve("Obo さん", ctx, users) == NotFound()


def test_composed_name_uses_the_persona_scoped_nickname_and_override() -> None:
    ctx = context([member(OBONYA, "obonya_dev", "Obonya")])
    users = users_of(
        record(
            OBONYA,
            has_personalization=True,
            nickname="Obo",
            persona_nickname="Bo",
            prefix_override="Master",
            persona_prefix_override="Sir",
        )
    )
    assert resolve("sir bo", ctx, users) == Resolved(OBONYA, "Obonya (@obonya_dev)", False, "composed_name")
    assert resolve("Master Obo", ctx, users) == NotFound()


def test_composed_name_mixes_the_users_prefix_with_the_persona_suffix() -> None:
    ctx = context([member(OBONYA, "obonya_dev", "Obonya")])
    users = users_of(record(OBONYA, has_personalization=True, nickname="obo", prefix_override="dear"))
    persona = persona_with(suffixes={"neutral": "-sama"})
    assert resolve("Dear obo-sama", ctx, users, persona) == Resolved(
        OBONYA, "Obonya (@obonya_dev)", False, "composed_name"
    )


def test_composed_name_shared_by_two_members_is_ambiguous() -> None:
    ctx = context([member(SPARROW, "a"), member(OBONYA, "b")])
    users = users_of(
        record(SPARROW, has_personalization=True, nickname="Obo", prefix_override="Master"),
        record(OBONYA, has_personalization=True, persona_nickname="Obo", persona_prefix_override="Master"),
    )
    assert resolve("Master Obo", ctx, users) == Ambiguous(("a", "b"))


def test_composed_name_skips_members_that_are_bots() -> None:
    ctx = context([member(BOT, "tomori", is_bot=True)])
    users = users_of(record(BOT, has_personalization=True, nickname="Obo", prefix_override="Master"))
    assert resolve("Master Obo", ctx, users) == NotFound()
