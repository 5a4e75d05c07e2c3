"""Property tests: the text rules and the resolver hold for any input hypothesis can build."""

from __future__ import annotations

import re

from hypothesis import assume, given
from hypothesis import strategies as st

from contracts.models import MAX_DISCORD_NAME, MAX_TARGET_ID, EventContext, GuildMember, Participant
from worker.pipeline.resolver import MAX_CANDIDATES, Ambiguous, NotFound, Resolved, resolve_target
from worker.pipeline.state import NamingConfig, PersonaState, UserRecord
from worker.pipeline.text import JS_WHITESPACE, js_trim, normalize_alias, sanitize_placeholders

ALLOWLIST = {"user", "user_formatted", "user_term", "bot", "char"}
PLACEHOLDER_TOKEN = re.compile(r"\{\{?([A-Za-z][A-Za-z0-9_]*)\}\}?")

#: Text heavy in the characters the rules care about, mixed with anything Unicode has.
interesting_text = st.text(
    alphabet=st.one_of(
        st.sampled_from([*JS_WHITESPACE, "@", "{", "}", "_", "Σ", "İ", "\x85", "\x1c"]),
        st.characters(),
    )
)
words = st.one_of(
    st.sampled_from(sorted(ALLOWLIST)).map(
        lambda w: "".join(c.upper() if i % 2 else c for i, c in enumerate(w))
    ),
    st.sampled_from(sorted(ALLOWLIST)),
    st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,8}", fullmatch=True),
)
tokens = st.one_of(words.map(lambda w: "{" + w + "}"), words.map(lambda w: "{{" + w + "}}"))
brace_free_text = st.text().map(lambda s: s.replace("{", "").replace("}", ""))
#: Placeholders that are not nested in other braces: what the model writes in practice.
flat_placeholder_text = st.lists(st.one_of(tokens, brace_free_text)).map("".join)


def unknown_tokens(text: str) -> list[str]:
    return [m.group(0) for m in PLACEHOLDER_TOKEN.finditer(text) if m.group(1).lower() not in ALLOWLIST]


# --- sanitize_placeholders ---------------------------------------------------------------------


@given(interesting_text)
def test_sanitize_never_raises_and_only_ever_removes_braces(text: str) -> None:
    cleaned = sanitize_placeholders(text)
    assert cleaned.replace("{", "").replace("}", "") == text.replace("{", "").replace("}", "")
    assert len(cleaned) <= len(text)


@given(brace_free_text)
def test_sanitize_leaves_text_without_braces_unchanged(text: str) -> None:
    assert sanitize_placeholders(text) == text


@given(flat_placeholder_text)
def test_sanitize_is_idempotent_on_unnested_placeholders(text: str) -> None:
    once = sanitize_placeholders(text)
    assert sanitize_placeholders(once) == once


@given(flat_placeholder_text)
def test_sanitize_output_has_no_unknown_placeholder(text: str) -> None:
    assert unknown_tokens(sanitize_placeholders(text)) == []


@given(st.lists(st.sampled_from(sorted(ALLOWLIST))), st.booleans())
def test_sanitize_keeps_every_allowlisted_placeholder(allowed: list[str], doubled: bool) -> None:
    text = " ".join(("{{%s}}" if doubled else "{%s}") % word.upper() for word in allowed)
    assert sanitize_placeholders(text) == text


# --- normalize_alias ---------------------------------------------------------------------------


def has_second_at_run(value: str) -> bool:
    """``"@ @x"``: the original drops one run of ``@`` only, so the result still starts with one."""
    return js_trim(js_trim(value).lstrip("@")).startswith("@")


@given(interesting_text)
def test_normalize_never_raises_and_is_lower_case_single_spaced_and_trimmed(value: str) -> None:
    key = normalize_alias(value)
    assert key == key.lower()
    assert key == js_trim(key)
    assert "  " not in key
    assert not any(char in JS_WHITESPACE and char != " " for char in key)


@given(interesting_text)
def test_normalize_has_no_leading_at_sign_and_is_idempotent(value: str) -> None:
    assume(not has_second_at_run(value))
    key = normalize_alias(value)
    assert not key.startswith("@")
    assert normalize_alias(key) == key


js_space = st.text(alphabet=st.sampled_from(JS_WHITESPACE))
second_at_run = st.tuples(
    js_space,
    st.text(alphabet="@", min_size=1),
    st.text(alphabet=st.sampled_from(JS_WHITESPACE), min_size=1),
    interesting_text,
).map(lambda parts: f"{parts[0]}{parts[1]}{parts[2]}@{parts[3]}")


@given(second_at_run)
def test_normalize_keeps_a_second_run_of_at_signs_like_the_original(value: str) -> None:
    assert has_second_at_run(value)
    assert normalize_alias(value).startswith("@")


# --- resolve_target ----------------------------------------------------------------------------

discord_ids = st.sampled_from([f"11500000000000002{n:02d}" for n in range(6)])
names = st.one_of(
    st.sampled_from(["Sparrow", "sparrow", "@Sparrow ", "Obo", "Master Sparrow", "Oboさん", "Cap", " "]),
    interesting_text,
)
optional_names = st.one_of(st.none(), names)


# what the contract lets a shard send (CONTRACT.md "Bounds"): Discord names of at most 32 characters, no NUL
def _envelope_safe(text: str) -> str:
    """What the envelope accepts in a name: no NUL, no lone surrogate (CONTRACT.md "Bounds")."""
    return "".join(c for c in text if c != "\x00" and not "\ud800" <= c <= "\udfff")


member_names = names.map(lambda s: _envelope_safe(s)[:MAX_DISCORD_NAME])
envelope_text = interesting_text.map(lambda s: _envelope_safe(s)[:MAX_TARGET_ID])
members = st.builds(
    GuildMember,
    user_disc_id=discord_ids,
    username=member_names,
    global_name=st.one_of(st.none(), member_names),
    nickname=st.one_of(st.none(), member_names),
    is_bot=st.booleans(),
)
participants = st.builds(
    Participant,
    target_id=st.one_of(discord_ids, st.sampled_from(["@alice:matrix.org", "persona:7"]), envelope_text),
    display_label=envelope_text,
    aliases=st.lists(envelope_text, max_size=4),
    is_bridge=st.booleans(),
)
affixes = st.dictionaries(st.sampled_from(["neutral", "masculine", "feminine"]), names, max_size=3)
personas = st.builds(
    PersonaState,
    persona_id=st.just(7),
    nickname=st.just("Tomori"),
    lineage_id=st.just(10000),
    naming=st.builds(NamingConfig, prefixes=affixes, suffixes=affixes),
)
user_records = st.builds(
    UserRecord,
    user_id=st.integers(min_value=1, max_value=10**6),
    user_disc_id=discord_ids,
    has_personalization=st.booleans(),
    nickname=optional_names,
    prefix_override=optional_names,
    suffix_override=optional_names,
    addressing_style=st.one_of(st.none(), st.sampled_from(["neutral", "masculine", "feminine", ""])),
    persona_nickname=optional_names,
    persona_prefix_override=optional_names,
    persona_suffix_override=optional_names,
)
contexts = st.builds(
    EventContext,
    guild_disc_id=st.one_of(st.none(), st.just("1150000000000000001")),
    channel_disc_id=st.just("1150000000000000100"),
    bot_user_disc_id=st.just("1150000000000000999"),
    persona_id=st.just(7),
    participants=st.lists(participants, max_size=6),
    guild_members=st.lists(members, max_size=8),
)
raw_targets = st.one_of(names, discord_ids, st.just("@alice:matrix.org"), interesting_text)


@given(raw_targets, contexts, personas, st.lists(user_records, max_size=6))
def test_resolve_target_never_raises_and_answers_with_someone_it_was_given(
    raw: str, context: EventContext, persona: PersonaState, records: list[UserRecord]
) -> None:
    users = {r.user_disc_id: r for r in records}
    result = resolve_target(raw, context, persona, users)
    assert isinstance(result, Resolved | Ambiguous | NotFound)
    known_ids = {p.target_id for p in context.participants}
    if context.guild_disc_id is not None:
        known_ids |= {m.user_disc_id for m in context.guild_members if not m.is_bot}
    if isinstance(result, Resolved):
        assert result.target_id in known_ids
        if context.guild_disc_id is None:
            assert result.source in {"legacy_id", "conversation"}
    if isinstance(result, Ambiguous):
        assert 2 <= len(result.candidates) <= MAX_CANDIDATES
    if not normalize_alias(raw):
        assert result == NotFound()
    assert resolve_target(raw, context, persona, users) == result
