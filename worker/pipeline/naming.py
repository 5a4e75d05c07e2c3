"""How the original names people: display names, labels, persona affixes, composed names."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import regex

from contracts.models import GuildMember, Participant
from worker.pipeline.state import NamingConfig, UserRecord
from worker.pipeline.text import JS_WHITESPACE, js_trim, utf16_length, utf16_slice

#: ``\p{P}`` / ``\p{S}`` or a CJK, kana or hangul character (plus the iteration and length marks that
#: carry no script of their own): an affix ending (prefix) or starting (suffix) with one binds tightly.
_TIGHT_JOIN = regex.compile(
    r"[\p{P}\p{S}\p{Script=Han}\p{Script=Hiragana}\p{Script=Katakana}\p{Script=Hangul}"
    r"\u3005\u303B\u309D\u309E\u30FC\u30FD\u30FE]"
)
#: Punctuation that closes a prefix into its own word: "Ms. Sparrow", "Yo! Sparrow".
_PREFIX_WORD_END = ".,;:!?"
_NEUTRAL_STYLE = "neutral"


def member_display_name(member: GuildMember) -> str:
    """discord.js ``displayName``: guild nickname, else global name, else username."""
    return member.nickname or member.global_name or member.username


def member_label(member: GuildMember) -> str:
    """``formatDiscordUserLabel``: the display name, plus `` (@username)`` when it is not the username."""
    name = js_trim(member.nickname or "") or js_trim(member.global_name or "") or js_trim(member.username)
    username = js_trim(member.username)
    if name.lower() == username.lower():
        return name
    return f"{name} (@{username})"


def participant_label(participant: Participant) -> str:
    """A conversation reference's label: bridge users get `` (Matrix)`` unless it is already there."""
    if participant.is_bridge and "(Matrix)" not in participant.display_label:
        return f"{participant.display_label} (Matrix)"
    return participant.display_label


def _joins_tightly(char: str) -> bool:
    return _TIGHT_JOIN.fullmatch(char) is not None


def _join_prefix(prefix: str, nickname: str) -> str:
    trimmed = js_trim(prefix)
    if not trimmed:
        return nickname
    if prefix[-1] in JS_WHITESPACE or trimmed[-1] in _PREFIX_WORD_END:
        return f"{trimmed} {nickname}"
    if _joins_tightly(trimmed[-1]):
        return f"{trimmed}{nickname}"
    return f"{trimmed} {nickname}"


def _join_suffix(name: str, suffix: str) -> str:
    trimmed = js_trim(suffix)
    if not trimmed:
        return name
    if suffix[0] not in JS_WHITESPACE and _joins_tightly(trimmed[0]):
        return f"{name}{trimmed}"
    return f"{name} {trimmed}"


def _capitalize_first_unit(name: str) -> str:
    # JS upper-cases ``charAt(0)``, one UTF-16 unit: half a surrogate pair upper-cases to itself.
    if not name or ord(name[0]) > 0xFFFF:
        return name
    return name[0].upper() + name[1:]


def format_user_name(nickname: str, prefix: str = "", suffix: str = "") -> str:
    """``formatUserName``: join prefix, nickname and suffix the way the persona addresses the user.

    A prefix ending in whitespace or in ``. , ; : ! ?`` is followed by a space; one ending in other
    punctuation, a symbol or a CJK/kana/hangul character binds without one ("@sparrow", "さん").
    The suffix mirrors that at its start. When the leading token (the prefix, else the nickname) has
    no upper-case letters, the first character of the result is upper-cased ("dad" -> "Dad Sparrow").
    """
    trimmed_nickname = js_trim(nickname)
    assembled = _join_suffix(_join_prefix(prefix, trimmed_nickname), suffix)
    leading_token = js_trim(prefix) or trimmed_nickname
    if leading_token == leading_token.lower():
        return _capitalize_first_unit(assembled)
    return assembled


def _persona_affix(values: Mapping[str, str], style: str) -> str:
    value = values.get(style)
    if value is None:
        value = values.get(_NEUTRAL_STYLE)
    return value if value is not None else ""


def _resolve_affix(
    persona_override: str | None, global_override: str | None, values: Mapping[str, str], style: str
) -> str:
    # Presence, not truthiness, decides: an empty override deliberately suppresses the persona's affix.
    if persona_override is not None:
        return persona_override
    if global_override is not None:
        return global_override
    return _persona_affix(values, style)


def effective_user_name(user: UserRecord, naming: NamingConfig, live_display_name: str = "") -> str:
    """``resolveEffectiveUserNaming`` + ``formatUserName``: the name this persona calls ``user`` by.

    The nickname is the first non-empty of the persona-scoped nickname, the saved global nickname and
    ``live_display_name``; each affix is the persona-scoped override, else the user's global override,
    else the persona's value for the user's addressing style (falling back to neutral). Returns ``""``
    when the user has no nickname at all.
    """
    nickname = (
        js_trim(user.persona_nickname or "") or js_trim(user.nickname or "") or js_trim(live_display_name)
    )
    if not nickname:
        return ""
    style = user.addressing_style if user.addressing_style is not None else _NEUTRAL_STYLE
    prefix = _resolve_affix(user.persona_prefix_override, user.prefix_override, naming.prefixes, style)
    suffix = _resolve_affix(user.persona_suffix_override, user.suffix_override, naming.suffixes, style)
    return format_user_name(nickname, prefix, suffix)


def _longest_first(values: Iterable[str]) -> list[str]:
    distinct = dict.fromkeys(trimmed for trimmed in map(js_trim, values) if trimmed)
    # Longest first, so a two-word affix is not half-consumed by a shorter one sharing its first word.
    return sorted(distinct, key=utf16_length, reverse=True)


def _strip_prefix(text: str, prefixes: list[str]) -> str:
    for prefix in prefixes:
        size = utf16_length(prefix)
        if utf16_length(text) > size and text.lower().startswith(prefix.lower()):
            return js_trim(utf16_slice(text, size))
    return text


def _strip_suffix(text: str, suffixes: list[str]) -> str:
    for suffix in suffixes:
        size = utf16_length(suffix)
        length = utf16_length(text)
        if length > size and text.lower().endswith(suffix.lower()):
            return js_trim(utf16_slice(text, 0, length - size))
    return text


def strip_persona_affixes(raw: str, naming: NamingConfig) -> str | None:
    """``stripNamingAffixes``: peel one persona prefix, then one persona suffix, off a requested name.

    Every addressing style's affixes are tried (the target's own style is not known yet), longest
    first, case-insensitively and with no word boundary ("Masterson" -> "son"). Returns ``None`` when
    nothing was removed or nothing would be left.
    """
    trimmed = js_trim(raw)
    stripped = _strip_prefix(trimmed, _longest_first(naming.prefixes.values()))
    stripped = _strip_suffix(stripped, _longest_first(naming.suffixes.values()))
    return stripped if stripped and stripped != trimmed else None
