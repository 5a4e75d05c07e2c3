"""How people are named: labels, formatted names, effective names, persona affix stripping."""

from __future__ import annotations

from typing import Any

import pytest

from contracts.models import GuildMember, Participant
from worker.pipeline.naming import (
    effective_user_name,
    format_user_name,
    member_display_name,
    member_label,
    participant_label,
    strip_persona_affixes,
)
from worker.pipeline.state import NamingConfig, UserRecord

MEMBER_ID = "1150000000000000201"


def member(username: str, global_name: str | None = None, nickname: str | None = None) -> GuildMember:
    return GuildMember(user_disc_id=MEMBER_ID, username=username, global_name=global_name, nickname=nickname)


def user(**fields: Any) -> UserRecord:
    return UserRecord(user_id=1, user_disc_id=MEMBER_ID, **fields)


# --- labels ------------------------------------------------------------------------------------


def test_display_name_prefers_nickname_then_global_name_then_username() -> None:
    assert member_display_name(member("sparrow_ow", "Sparrow", "Cap")) == "Cap"
    assert member_display_name(member("sparrow_ow", "Sparrow")) == "Sparrow"
    assert member_display_name(member("sparrow_ow")) == "sparrow_ow"


def test_member_label_is_the_bare_name_when_it_is_the_username_in_any_case() -> None:
    assert member_label(member("sparrow")) == "sparrow"
    assert member_label(member("sparrow", "Sparrow")) == "Sparrow"


def test_member_label_adds_the_username_when_the_display_name_differs() -> None:
    assert member_label(member("sparrow_ow", "Sparrow", "Cap")) == "Cap (@sparrow_ow)"


def test_member_label_skips_a_blank_nickname() -> None:
    assert member_label(member("sparrow_ow", "Sparrow", "\u3000 ")) == "Sparrow (@sparrow_ow)"


def test_participant_label_marks_bridge_users_once() -> None:
    alice = Participant(target_id="@alice:matrix.org", display_label="Alice", is_bridge=True)
    marked = Participant(target_id="@bob:matrix.org", display_label="Bob (Matrix)", is_bridge=True)
    discord = Participant(target_id=MEMBER_ID, display_label="Master Sparrow")
    assert participant_label(alice) == "Alice (Matrix)"
    assert participant_label(marked) == "Bob (Matrix)"
    assert participant_label(discord) == "Master Sparrow"


# --- format_user_name --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nickname", "prefix", "suffix", "expected"),
    [
        ("Sparrow", "", "", "Sparrow"),
        ("  Sparrow  ", "", "", "Sparrow"),
        ("Sparrow", "   ", "  ", "Sparrow"),
        ("Sparrow", "Master", "", "Master Sparrow"),
        ("Sparrow", "Master ", "", "Master Sparrow"),
        ("Sparrow", "Ms.", "", "Ms. Sparrow"),
        ("Sparrow", "Yo!", "", "Yo! Sparrow"),
        ("Sparrow", "Well,", "", "Well, Sparrow"),
        ("Sparrow", "Captain-", "", "Captain-Sparrow"),
        ("Sparrow", "★", "", "★Sparrow"),
        ("Sparrow", "@", "", "@Sparrow"),
        ("Sparrow", "お", "", "おSparrow"),
        ("Sparrow", "様", "", "様Sparrow"),
        ("Sparrow", "カ", "", "カSparrow"),
        ("Sparrow", "님", "", "님Sparrow"),
        ("Sparrow", "ー", "", "ーSparrow"),
        ("Sparrow", "々", "", "々Sparrow"),
        ("Sparrow", "ゝ", "", "ゝSparrow"),
        ("Sparrow", "お ", "", "お Sparrow"),
        ("Sparrow", "", "-chan", "Sparrow-chan"),
        ("Sparrow", "", "さん", "Sparrowさん"),
        ("Sparrow", "", "様", "Sparrow様"),
        ("Sparrow", "", "ー", "Sparrowー"),
        ("Sparrow", "", "!", "Sparrow!"),
        ("Sparrow", "", "san", "Sparrow san"),
        ("Sparrow", "", " さん", "Sparrow さん"),
        ("Sparrow", "", " -chan", "Sparrow -chan"),
        ("Sparrow", "Master", "-sama", "Master Sparrow-sama"),
    ],
)
def test_format_user_name_joins_affixes_by_their_edge_characters(
    nickname: str, prefix: str, suffix: str, expected: str
) -> None:
    assert format_user_name(nickname, prefix, suffix) == expected


@pytest.mark.parametrize(
    ("nickname", "prefix", "expected"),
    [
        ("Sparrow", "dad", "Dad Sparrow"),
        ("sparrow", "", "Sparrow"),
        ("sparrow", "Dad", "Dad sparrow"),
        ("sparrow", "@", "@sparrow"),
        ("sparrow", "super-", "Super-sparrow"),
        ("SPARROW", "", "SPARROW"),
        ("sPARROW", "", "sPARROW"),
        ("さくら", "", "さくら"),
        ("ßparrow", "", "SSparrow"),
    ],
)
def test_format_user_name_capitalises_only_when_the_leading_token_is_lower_case(
    nickname: str, prefix: str, expected: str
) -> None:
    assert format_user_name(nickname, prefix) == expected


def test_format_user_name_leaves_a_character_outside_the_bmp_uncapitalised_like_js_charat() -> None:
    deseret_small = "\U00010428"
    assert format_user_name(f"{deseret_small}x") == f"{deseret_small}x"


# --- effective_user_name -----------------------------------------------------------------------

PERSONA_NAMING = NamingConfig(
    prefixes={"neutral": "Master", "feminine": "Lady"},
    suffixes={"neutral": "-san", "masculine": "-kun"},
)


def test_effective_name_uses_the_neutral_persona_affixes_without_an_addressing_style() -> None:
    assert effective_user_name(user(nickname="Obo"), PERSONA_NAMING) == "Master Obo-san"


def test_effective_name_uses_the_persona_affixes_of_the_users_style_falling_back_to_neutral() -> None:
    assert effective_user_name(user(nickname="Obo", addressing_style="feminine"), PERSONA_NAMING) == (
        "Lady Obo-san"
    )
    assert effective_user_name(user(nickname="Obo", addressing_style="masculine"), PERSONA_NAMING) == (
        "Master Obo-kun"
    )


def test_effective_name_prefers_the_users_own_override_to_the_persona_config() -> None:
    record = user(nickname="Obo", prefix_override="Dear", suffix_override="さん")
    assert effective_user_name(record, PERSONA_NAMING) == "Dear Oboさん"


def test_effective_name_prefers_the_persona_scoped_override_to_the_global_one() -> None:
    record = user(nickname="Obo", prefix_override="Dear", persona_prefix_override="Sir")
    assert effective_user_name(record, PERSONA_NAMING) == "Sir Obo-san"


def test_effective_name_treats_an_empty_override_as_a_deliberate_suppression() -> None:
    assert effective_user_name(user(nickname="Obo", prefix_override=""), PERSONA_NAMING) == "Obo-san"
    record = user(nickname="Obo", prefix_override="Dear", persona_prefix_override="", suffix_override="")
    assert effective_user_name(record, PERSONA_NAMING) == "Obo"


def test_effective_name_takes_the_persona_nickname_then_the_global_one_then_the_live_name() -> None:
    naming = NamingConfig()
    assert effective_user_name(user(persona_nickname=" Bo ", nickname="Obo"), naming, "Live") == "Bo"
    assert effective_user_name(user(persona_nickname="  ", nickname="Obo"), naming, "Live") == "Obo"
    assert effective_user_name(user(nickname="\u3000"), naming, " Live ") == "Live"


def test_effective_name_is_empty_without_any_nickname() -> None:
    assert effective_user_name(user(prefix_override="Master"), PERSONA_NAMING) == ""


def test_effective_name_without_any_affix_is_the_capitalised_nickname() -> None:
    assert effective_user_name(user(nickname="obo"), NamingConfig()) == "Obo"


# --- strip_persona_affixes ---------------------------------------------------------------------


def naming(prefixes: dict[str, str] | None = None, suffixes: dict[str, str] | None = None) -> NamingConfig:
    return NamingConfig(prefixes=prefixes or {}, suffixes=suffixes or {})


@pytest.mark.parametrize(
    ("raw", "config", "expected"),
    [
        ("Master Sparrow", naming({"neutral": "Master"}), "Sparrow"),
        ("  master   Sparrow ", naming({"neutral": "Master"}), "Sparrow"),
        ("Obonya-chan", naming(suffixes={"neutral": "-chan"}), "Obonya"),
        ("Masterson", naming({"neutral": "Master"}), "son"),
        ("Mistress Obo", naming({"neutral": "Master", "feminine": "Mistress"}), "Obo"),
        ("Great Master Obo", naming({"neutral": "Great", "masculine": "Great Master"}), "Obo"),
        ("Master Master Obo", naming({"neutral": "Master"}), "Master Obo"),
        ("Master Obo-san", naming({"neutral": "Master"}, {"neutral": "-san"}), "Obo"),
        ("Oboさん", naming(suffixes={"neutral": "さん"}), "Obo"),
        ("𝓜aster Obo", naming({"neutral": "𝓜aster"}), "Obo"),
        ("Master Obo", naming({"neutral": "  Master  "}), "Obo"),
    ],
)
def test_strip_persona_affixes_removes_one_prefix_then_one_suffix(
    raw: str, config: NamingConfig, expected: str
) -> None:
    assert strip_persona_affixes(raw, config) == expected


@pytest.mark.parametrize(
    ("raw", "config"),
    [
        ("Sparrow", naming({"neutral": "Master"}, {"neutral": "-chan"})),
        ("Master", naming({"neutral": "Master"})),
        ("  Master  ", naming({"neutral": "Master"})),
        ("-chan", naming(suffixes={"neutral": "-chan"})),
        ("Master Sparrow", naming({"neutral": "   "})),
        ("Master Sparrow", NamingConfig()),
    ],
)
def test_strip_persona_affixes_returns_none_when_nothing_is_removed(raw: str, config: NamingConfig) -> None:
    assert strip_persona_affixes(raw, config) is None


def test_strip_persona_affixes_needs_the_input_strictly_longer_than_the_affix() -> None:
    config = naming({"neutral": "Master"}, {"neutral": "-chan"})
    assert strip_persona_affixes("Master-chan", config) == "-chan"
