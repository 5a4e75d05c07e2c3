"""The success notice: display rendering, preview, exact en-US strings (reference section 6)."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import accumulate

import pytest
import regex
from hypothesis import given
from hypothesis import strategies as st

from contracts.models import (
    EMBED_TOTAL_LIMIT,
    NOTICE_DESCRIPTION_LIMIT,
    NOTICE_FULL_CONTENT_LIMIT,
    NOTICE_TITLE_LIMIT,
    GuildMember,
    Notice,
)
from worker.pipeline.notice import (
    PERSONAL_MEMORY_FOOTER_MANAGE,
    PERSONAL_MEMORY_FOOTER_PERSONALIZATION_DISABLED,
    PERSONAL_MEMORY_FOOTER_USER_BLACKLISTED,
    SERVER_MEMORY_FOOTER,
    build_preview,
    clip,
    mentioned_user_ids,
    neutralize_backticks,
    personal_footer,
    personal_notice,
    render_for_display,
    server_notice,
)
from worker.pipeline.state import UserRecord

BOT = "1150000000000000999"
ALICE = "1150000000000000201"
BOB = "1150000000000000202"
STRANGER = "1150000000000000404"
ZWSP = "\u200b"
FAMILY = "👨\u200d👩\u200d👧"  # five code points, one grapheme cluster
DOCS = "https://docs.tomoribot.app/en/features/knowledge/memory/#long-term-memory"

ALICE_MEMBER = GuildMember(
    user_disc_id=ALICE, username="alice_ow", global_name="Alice G", nickname="Guild Alice"
)
BOB_MEMBER = GuildMember(user_disc_id=BOB, username="bob_ow", global_name="Bobby", nickname=None)
MEMBERS = {ALICE: ALICE_MEMBER, BOB: BOB_MEMBER}


def render(
    content: str,
    *,
    user_name: str | None = "Alice",
    bot_nickname: str = "Tomori",
    users: Mapping[str, UserRecord] | None = None,
    members: Mapping[str, GuildMember] = MEMBERS,
    personal_memories_enabled: bool = True,
) -> str:
    return render_for_display(
        content,
        user_name=user_name,
        bot_nickname=bot_nickname,
        bot_user_disc_id=BOT,
        users=users if users is not None else {},
        members=members,
        personal_memories_enabled=personal_memories_enabled,
    )


def saved(disc_id: str, nickname: str | None, *, blacklisted: bool = False) -> dict[str, UserRecord]:
    return {disc_id: UserRecord(user_id=1, user_disc_id=disc_id, nickname=nickname, blacklisted=blacklisted)}


def clusters(text: str) -> list[str]:
    return list(regex.findall(r"\X", text))


# --- exact strings ----------------------------------------------------------------------------------


def test_server_notice_has_the_original_strings() -> None:
    notice = server_notice(title_name="Tomori", rendered_content="  Alice likes dogs\n")

    assert notice.model_dump() == {
        "kind": "server_memory",
        "title": "🧠 Tomori Learned Something New!",
        "description": f"A **[Server Memory]({DOCS})** has been saved:\n```\nAlice likes dogs\n```",
        "footer": "Server managers can manage this memory using `/memories`.",
        "accent_color": "#2ECC71",
        "full_content": "Alice likes dogs",
        "expandable": False,
    }


def test_personal_notice_has_the_original_strings() -> None:
    notice = personal_notice(
        title_name="Tomori",
        target_label="Master Sparrow",
        rendered_content="Master Sparrow likes tea",
        footer=PERSONAL_MEMORY_FOOTER_MANAGE,
    )

    assert notice.model_dump() == {
        "kind": "personal_memory",
        "title": "💡 Tomori Learned Something New about Master Sparrow!",
        "description": (
            f"A **[Personal Memory]({DOCS})** about Master Sparrow has been saved:\n"
            "```\nMaster Sparrow likes tea\n```"
        ),
        "footer": "You can manage your personal memories using `/personal memories`.",
        "accent_color": "#2ECC71",
        "full_content": "Master Sparrow likes tea",
        "expandable": False,
    }


def test_footers_are_the_original_strings() -> None:
    assert SERVER_MEMORY_FOOTER == "Server managers can manage this memory using `/memories`."
    assert PERSONAL_MEMORY_FOOTER_MANAGE == (
        "You can manage your personal memories using `/personal memories`."
    )
    assert PERSONAL_MEMORY_FOOTER_PERSONALIZATION_DISABLED == (
        "This memory was saved, but personalization features are currently disabled on this server, "
        "so it will not have an immediate effect here. Use `/export personal memories` to view it. "
        "You can opt out with `/personal config`."
    )
    assert PERSONAL_MEMORY_FOOTER_USER_BLACKLISTED == (
        "This memory was saved, but the user in question is currently blacklisted from "
        "personalization features on this server, so it will not have an immediate effect here. "
        "Use `/export personal memories` to view it. You can opt out with `/personal config`."
    )


@pytest.mark.parametrize(
    ("enabled", "blacklisted", "expected"),
    [
        (False, False, PERSONAL_MEMORY_FOOTER_PERSONALIZATION_DISABLED),
        (False, True, PERSONAL_MEMORY_FOOTER_PERSONALIZATION_DISABLED),  # disabled is checked first
        (True, True, PERSONAL_MEMORY_FOOTER_USER_BLACKLISTED),
        (True, False, PERSONAL_MEMORY_FOOTER_MANAGE),
    ],
)
def test_personal_footer_selection_order(enabled: bool, blacklisted: bool, expected: str) -> None:
    assert personal_footer(personal_memories_enabled=enabled, target_blacklisted=blacklisted) == expected


def test_an_empty_title_name_falls_back_to_tomoribot() -> None:
    assert server_notice(title_name="", rendered_content="x").title == "🧠 TomoriBot Learned Something New!"
    personal = personal_notice(title_name="", target_label="Bob", rendered_content="x", footer="f")
    assert personal.title == "💡 TomoriBot Learned Something New about Bob!"


def test_names_with_replacement_patterns_are_shown_as_written() -> None:
    notice = personal_notice(
        title_name="Tomo$&", target_label="{persona_nickname} $1", rendered_content="x", footer="f"
    )
    assert notice.title == "💡 Tomo$& Learned Something New about {persona_nickname} $1!"


def test_long_content_is_previewed_but_kept_whole_for_the_button() -> None:
    content = "a" * 700 + "``` b"
    notice = server_notice(title_name="Tomori", rendered_content=content)

    assert notice.expandable
    assert notice.description.endswith("```\n" + "a" * 600 + "\n```")
    assert notice.full_content == "a" * 700 + f"`{ZWSP}`{ZWSP}` b"


def test_backticks_in_content_cannot_close_the_description_fence() -> None:
    notice = server_notice(title_name="Tomori", rendered_content="a ``` b ```` c")
    body = notice.description.split("```\n", 1)[1].rsplit("\n```", 1)[0]

    assert "``" not in body
    assert body == f"a `{ZWSP}`{ZWSP}` b `{ZWSP}`{ZWSP}`{ZWSP}` c"
    assert notice.full_content == body


# --- backticks --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("no ticks", "no ticks"),
        ("`code`", "`code`"),
        ("``", f"`{ZWSP}`"),
        ("```", f"`{ZWSP}`{ZWSP}`"),
        ("x`````y", f"x`{ZWSP}`{ZWSP}`{ZWSP}`{ZWSP}`y"),
        ("`` and ``", f"`{ZWSP}` and `{ZWSP}`"),
    ],
)
def test_neutralize_backticks(text: str, expected: str) -> None:
    assert neutralize_backticks(text) == expected
    assert neutralize_backticks(expected) == expected  # idempotent


# --- preview ----------------------------------------------------------------------------------------


def test_preview_trims_and_keeps_short_text() -> None:
    assert build_preview("  \n hello \t\n") == ("hello", False)
    # JavaScript's trim also strips U+FEFF, which Python's str.strip keeps.
    assert build_preview("\ufeffhello\u3000") == ("hello", False)


def test_preview_of_exactly_the_limit_is_not_expandable() -> None:
    assert build_preview("a" * 600) == ("a" * 600, False)
    assert build_preview("a" * 601) == ("a" * 600, True)


def test_preview_never_splits_an_emoji_zwj_sequence() -> None:
    text = "a" * 597 + FAMILY + "b"  # the family spans code points 598..602

    preview, expandable = build_preview(text)

    assert expandable
    assert preview == "a" * 597


def test_preview_keeps_a_cluster_that_ends_on_the_limit() -> None:
    preview, expandable = build_preview("a" * 595 + FAMILY + "b")

    assert expandable
    assert preview == "a" * 595 + FAMILY
    assert len(preview) == 600


def test_preview_never_splits_combining_marks() -> None:
    text = "a" * 599 + "e\u0301\u0323" + "z"  # e + acute + dot below straddles 600

    preview, expandable = build_preview(text)

    assert expandable
    assert preview == "a" * 599


def test_preview_counts_guards_against_the_limit() -> None:
    preview, expandable = build_preview("a" * 598 + "```")  # guarded: 598 + 5 code points

    assert expandable
    assert preview == "a" * 598 + "`" + ZWSP
    assert "``" not in preview


def test_preview_with_a_small_limit() -> None:
    assert build_preview(FAMILY * 3, limit=12) == (FAMILY * 2, True)
    assert build_preview("abc", limit=0) == ("", True)


# --- mentions ---------------------------------------------------------------------------------------


def test_mentioned_user_ids_covers_the_three_at_forms_only() -> None:
    content = f"<@{ALICE}> <@!{BOB}> <@&{STRANGER}> <#{BOT}> <@1234> <@{ALICE}>"
    assert mentioned_user_ids(content) == {ALICE, BOB, STRANGER}


def test_bot_mention_shows_the_persona_nickname() -> None:
    assert render(f"<@{BOT}> likes <@!{BOT}>") == "Tomori likes Tomori"


def test_saved_nickname_wins_over_the_guild() -> None:
    assert render(f"<@{ALICE}> likes tea", users=saved(ALICE, "Ally")) == "Ally likes tea"


def test_blacklisted_user_shows_their_guild_nickname() -> None:
    users = saved(ALICE, "Ally", blacklisted=True)
    assert render(f"<@{ALICE}> likes tea", users=users) == "Guild Alice likes tea"


def test_personalization_disabled_shows_the_guild_nickname() -> None:
    rendered = render(f"<@{ALICE}> likes tea", users=saved(ALICE, "Ally"), personal_memories_enabled=False)
    assert rendered == "Guild Alice likes tea"


def test_without_a_guild_nickname_the_username_is_shown_not_the_global_name() -> None:
    assert render(f"<@!{BOB}> likes tea", users=saved(BOB, None)) == "bob_ow likes tea"


def test_an_unknown_user_is_left_as_written() -> None:
    assert render(f"<@{STRANGER}> and <@!{STRANGER}>") == f"<@{STRANGER}> and <@!{STRANGER}>"


def test_a_role_mention_is_rendered_as_a_user() -> None:
    # The original's user branch tests startsWith("<@") before the role branch.
    assert render(f"<@&{ALICE}> rules", users=saved(ALICE, "Ally")) == "Ally rules"


def test_channels_stay_mentions_and_links_become_mentions() -> None:
    channel = "1150000000000000100"
    content = (
        f"see <#{channel}>, https://discord.com/channels/{ALICE}/{channel}/{BOB} and "
        f"HTTPS://canary.discordapp.com/channels/@me/{channel}"
    )
    assert render(content) == f"see <#{channel}>, <#{channel}> and <#{channel}>"


def test_only_ascii_digits_make_a_mention() -> None:
    arabic_indic = "١" * 18
    assert render(f"<@{arabic_indic}> {{user}}") == f"<@{arabic_indic}> Alice"


# --- identity macros --------------------------------------------------------------------------------


def test_macros_allow_whitespace_and_any_case() -> None:
    assert render("{ USER } met {{bot}}, {char} and {{ User }}") == "Alice met Tomori, Tomori and Alice"


def test_user_defaults_to_user() -> None:
    assert render("{user} likes {bot}", user_name=None) == "User likes Tomori"
    assert render("{user} likes {bot}", user_name="") == "User likes Tomori"


def test_user_formatted_and_user_term_stay_literal() -> None:
    content = "{user_formatted} {{user_term}} { USER_FORMATTED } {user}"
    assert render(content) == "{user_formatted} {{user_term}} { USER_FORMATTED } Alice"


def test_lookalike_letters_do_not_spell_a_macro() -> None:
    # JavaScript's /i without /u folds ASCII only: a long s is not an s.
    assert render("{uſer} {user}") == "{uſer} Alice"


def test_dollar_patterns_in_names_are_inserted_literally() -> None:
    rendered = render("{user} and {bot}", user_name="A$&b$1", bot_nickname=r"T\1\g<0>$$")
    assert rendered == r"A$&b$1 and T\1\g<0>$$"


def test_mention_names_are_inserted_literally() -> None:
    assert render(f"<@{ALICE}>!", users=saved(ALICE, r"$& \g<0>")) == r"$& \g<0>!"


def test_an_empty_bot_nickname_falls_back_to_tomori() -> None:
    assert render("{bot}", bot_nickname="") == "Tomori"


def test_whitespace_macros_alone_stay_literal_as_in_the_original() -> None:
    # convertMentions returns early unless it sees a mention, a link or a brace-tight macro.
    assert render("{ user } likes dogs") == "{ user } likes dogs"
    assert render("{ user } likes {bot}") == "Alice likes Tomori"
    assert render(f"{{ user }} likes <@{BOT}>") == "Alice likes Tomori"


def test_plain_text_is_unchanged() -> None:
    assert render("  nothing to see `here`  ") == "  nothing to see `here`  "


# --- properties -------------------------------------------------------------------------------------

_fragments = st.sampled_from(
    [
        f"<@{ALICE}>",
        f"<@!{BOT}>",
        f"<@&{BOB}>",
        f"<#{STRANGER}>",
        "{user}",
        "{{ BOT }}",
        "{ char }",
        "{user_term}",
        "$&",
        "\\1",
        "``",
        "`",
        FAMILY,
        "e\u0301",
        "\u200b",
        " ",
        "\n",
        f"https://discord.com/channels/@me/{ALICE}",
    ]
)
_texts = st.one_of(st.text(), st.lists(st.one_of(_fragments, st.text(max_size=5))).map("".join))


@given(
    content=_texts, user_name=st.one_of(st.none(), st.text()), bot_nickname=st.text(), enabled=st.booleans()
)
def test_render_for_display_never_raises(
    content: str, user_name: str | None, bot_nickname: str, enabled: bool
) -> None:
    rendered = render(
        content,
        user_name=user_name,
        bot_nickname=bot_nickname,
        users=saved(ALICE, "Ally"),
        personal_memories_enabled=enabled,
    )
    assert isinstance(rendered, str)


@given(text=_texts, limit=st.integers(min_value=0, max_value=40))
def test_preview_is_a_grapheme_prefix_within_the_limit(text: str, limit: int) -> None:
    preview, expandable = build_preview(text, limit)
    guarded, _ = build_preview(text, limit=10**9)  # trimmed and guarded, not cut

    assert len(preview) <= limit
    assert guarded.startswith(preview)
    assert expandable == (len(guarded) > limit)
    if not expandable:
        assert preview == guarded
    boundaries = {0, *accumulate(len(cluster) for cluster in clusters(guarded))}
    assert len(preview) in boundaries


# --- bounds: Discord's embed limits, whatever the names (security-review-3: 202 KB in, 33 MB of notice out) -


def assert_within_discord_limits(notice: Notice) -> None:
    assert len(notice.title) <= NOTICE_TITLE_LIMIT
    assert len(notice.description) <= NOTICE_DESCRIPTION_LIMIT
    assert len(notice.title) + len(notice.description) + len(notice.footer) <= EMBED_TOTAL_LIMIT
    assert len(notice.full_content) <= NOTICE_FULL_CONTENT_LIMIT
    assert len(f"```\n{notice.full_content}\n```") <= NOTICE_DESCRIPTION_LIMIT  # the "Show Full Memory" embed
    assert notice.description.endswith("\n```")  # the preview's fence is never cut
    Notice.model_validate(notice.model_dump())


def test_user_repeated_with_a_huge_saved_nickname_gives_a_bounded_notice() -> None:
    # the review's case: "{user}" 166 times; the name now comes at most 256 characters long into the text
    content = "{user} " * 166
    rendered = render(content, user_name="N" * 200_000)
    assert len(rendered) <= 166 * 257
    notice = server_notice(title_name="Tomori", rendered_content=rendered)
    assert_within_discord_limits(notice)
    assert notice.expandable
    assert notice.full_content.endswith("…")
    assert notice.full_content.startswith("N" * 255 + "… " + "N" * 255 + "…")


def test_long_names_in_mentions_and_the_bot_name_are_cut() -> None:
    content = f"<@{ALICE}> and <@{BOT}> and {{bot}}"
    rendered = render(content, bot_nickname="B" * 1000, users=saved(ALICE, "A" * 1000))
    assert rendered == f"{'A' * 255}… and {'B' * 255}… and {'B' * 255}…"


def test_a_long_title_name_or_label_is_cut_to_the_title_limit() -> None:
    notice = personal_notice(
        title_name="T" * 300,
        target_label="L" * 5000,
        rendered_content="likes tea",
        footer=PERSONAL_MEMORY_FOOTER_MANAGE,
    )
    assert_within_discord_limits(notice)
    assert notice.title == "💡 " + "T" * (NOTICE_TITLE_LIMIT - 3) + "…"
    assert notice.title.endswith("…")
    assert f"about {'L' * 255}… has been saved:" in notice.description


def test_a_preview_limit_past_the_description_limit_is_held_to_it() -> None:
    notice = server_notice(title_name="Tomori", rendered_content="a" * 9000, preview_limit=10**6)
    assert_within_discord_limits(notice)
    assert notice.expandable
    assert len(notice.description) == NOTICE_DESCRIPTION_LIMIT


def test_clip_cuts_on_a_grapheme_boundary_within_the_limit() -> None:
    assert clip("abc", 3) == "abc"
    assert clip("abcd", 3) == "ab…"
    assert clip("a" + FAMILY + "b", 4) == "a…"  # the family is kept whole or dropped whole
    assert clip("a" + "\u0301" * 900, 10) == "…"


@given(st.text(max_size=300), st.text(max_size=300), st.integers(min_value=0, max_value=5000))
def test_any_notice_keeps_to_the_limits(name: str, label: str, repeat: int) -> None:
    rendered = render("{user}" * min(repeat, 170), user_name=label)
    assert_within_discord_limits(server_notice(title_name=name, rendered_content=rendered))
    assert_within_discord_limits(
        personal_notice(title_name=name, target_label=label, rendered_content=rendered, footer="f")
    )
