"""The success notice: the saved content rendered for display, its preview, and the en-US strings.

:func:`notice_for` renders the notification of a :class:`~worker.pipeline.plan.SavePlan`, once; the
functions under it are its parts.

Pure functions over plain data (reference section 6). The stored memory keeps its ``{user}``/``{bot}``
macros and ``<@id>`` mentions; only what the shard displays is expanded here. The worker has no
Discord client: everything it knows about people arrives as ``users`` (Postgres) and ``members``
(the event's ``guild_members``), so a name it cannot find leaves the mention as written.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import regex

from contracts.models import (
    EMBED_TOTAL_LIMIT,
    MAX_LABEL,
    NOTICE_DESCRIPTION_LIMIT,
    NOTICE_FULL_CONTENT_LIMIT,
    NOTICE_TITLE_LIMIT,
    GuildMember,
    Notice,
    Notification,
    ToolCallEvent,
)
from worker.pipeline.limits import DEFAULT_NOTICE_PREVIEW_LIMIT
from worker.pipeline.naming import member_display_name
from worker.pipeline.plan import SavePlan
from worker.pipeline.state import UserRecord
from worker.pipeline.text import JS_WHITESPACE, js_trim

#: ``MEMORY_NOTICE_PREVIEW_LIMIT``: code points of rendered content shown before "Show Full Memory".
MEMORY_NOTICE_PREVIEW_LIMIT = DEFAULT_NOTICE_PREVIEW_LIMIT
#: ``ColorCode.SUCCESS``.
NOTICE_ACCENT_COLOR = "#2ECC71"
#: Title name when neither ``reply_via.username`` nor a persona nickname is available.
DEFAULT_TITLE_NAME = "TomoriBot"
#: The original's last fallback for the bot's name when no persona nickname is known.
DEFAULT_BOT_NAME = "Tomori"
#: ``{user}`` when the caller has no name for the user.
DEFAULT_USER_NAME = "User"

MEMORY_DOCS_URL = "https://docs.tomoribot.app/en/features/knowledge/memory/#long-term-memory"

#: ``genai.self_teach.*`` footers, en-US (reference 6.5).
SERVER_MEMORY_FOOTER = "Server managers can manage this memory using `/memories`."
PERSONAL_MEMORY_FOOTER_MANAGE = "You can manage your personal memories using `/personal memories`."
PERSONAL_MEMORY_FOOTER_PERSONALIZATION_DISABLED = (
    "This memory was saved, but personalization features are currently disabled on this server, "
    "so it will not have an immediate effect here. Use `/export personal memories` to view it. "
    "You can opt out with `/personal config`."
)
PERSONAL_MEMORY_FOOTER_USER_BLACKLISTED = (
    "This memory was saved, but the user in question is currently blacklisted from personalization "
    "features on this server, so it will not have an immediate effect here. Use `/export personal "
    "memories` to view it. You can opt out with `/personal config`."
)

#: U+200B between backticks: renders as nothing but stops a run from closing the notice's fence.
FENCE_GUARD = "\u200b"

_WS = "[" + re.escape(JS_WHITESPACE) + "]*"

_BACKTICK_RUN = re.compile(r"`{2,}")
_GRAPHEME = regex.compile(r"\X")

# ``[0-9]`` and re.ASCII, not ``\d`` and Unicode: JavaScript's ``\d`` and ``/i`` are ASCII-only, so
# Arabic-Indic digits are no snowflake and ``ſ`` (long s) does not spell ``user``.
_FLAGS = re.IGNORECASE | re.ASCII
_CHANNEL_LINK = re.compile(
    r"https?://(?:canary\.|ptb\.)?discord(?:app)?\.com/channels/(?:@me|[0-9]{17,19})/([0-9]{17,19})"
    r"(?:/([0-9]{17,19}))?",
    _FLAGS,
)
_MENTION = re.compile(r"<[@#][!&]?([0-9]{17,19})>")
_USER_MENTION = re.compile(r"<@[!&]?([0-9]{17,19})>")
_STRICT_MACRO = re.compile(
    r"\{\{(?:bot|char|user|user_formatted|user_term)\}\}|\{(?:bot|char|user|user_formatted|user_term)\}",
    _FLAGS,
)

#: ``replaceTemplateVariables`` order: ``char`` comes last, as an alias of ``bot``.
_MACRO_NAMES = ("bot", "user", "user_formatted", "user_term", "char")
_MACRO_PATTERNS: dict[str, tuple[re.Pattern[str], re.Pattern[str]]] = {
    name: (
        re.compile(r"\{\{" + _WS + name + _WS + r"\}\}", _FLAGS),
        re.compile(r"\{" + _WS + name + _WS + r"\}", _FLAGS),
    )
    for name in _MACRO_NAMES
}


def notice_for(
    plan: SavePlan, event: ToolCallEvent, users: Mapping[str, UserRecord], preview_limit: int
) -> Notification:
    """The notification of a save, to the event's channel: the server or personal notice for ``plan``.

    ``users`` are the loaded ``users`` rows (names for mentions); ``preview_limit`` is the settings'
    ``MEMORY_NOTICE_PREVIEW_LIMIT``. The title names ``reply_via.username``, else the persona's nickname;
    ``{user}`` is the target's label in a personal notice and the author's name in a server one
    (:func:`author_name`).
    """
    ctx = event.context
    members = {m.user_disc_id: m for m in ctx.guild_members}
    title_name = (ctx.reply_via.username if ctx.reply_via else "") or plan.persona.nickname
    target = plan.target
    rendered = render_for_display(
        plan.content,
        user_name=author_name(event, plan.author, members) if target is None else target.label,
        bot_nickname=plan.persona.nickname,
        bot_user_disc_id=ctx.bot_user_disc_id,
        users=users,
        members=members,
        personal_memories_enabled=plan.server.personal_memories_enabled,
    )
    if target is None:
        notice = server_notice(title_name=title_name, rendered_content=rendered, preview_limit=preview_limit)
    else:
        footer = personal_footer(
            personal_memories_enabled=plan.server.personal_memories_enabled,
            target_blacklisted=target.user.blacklisted,
        )
        notice = personal_notice(
            title_name=title_name,
            target_label=target.label,
            rendered_content=rendered,
            footer=footer,
            preview_limit=preview_limit,
        )
    return Notification(
        event_id=event.event_id,
        guild_disc_id=ctx.guild_disc_id,
        channel_disc_id=ctx.channel_disc_id,
        thread_id=ctx.thread_id,
        reply_via=ctx.reply_via,
        notice=notice,
    )


def author_name(event: ToolCallEvent, author: UserRecord, members: Mapping[str, GuildMember]) -> str:
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


def neutralize_backticks(text: str) -> str:
    """Put U+200B between the backticks of every run of two or more, so content cannot close a fence.

    Interleaving the whole run, rather than replacing each triple backtick, leaves no two backticks
    adjacent at any run length (five would otherwise keep a closing fence), and applying it twice
    changes nothing more.
    """
    return _BACKTICK_RUN.sub(lambda run: FENCE_GUARD.join(run.group()), text)


def build_preview(text: str, limit: int = MEMORY_NOTICE_PREVIEW_LIMIT) -> tuple[str, bool]:
    """``buildTextPreview``: trim, neutralise backtick runs, then cut to at most ``limit`` code points.

    The cut falls on an extended grapheme cluster boundary (an emoji ZWJ sequence or a letter with
    its combining marks is kept whole or dropped whole) and adds no ellipsis. Guarding happens
    before the cut so the guards count against the limit. Returns ``(preview, expandable)``, where
    ``expandable`` says the guarded text was longer than ``limit``.
    """
    guarded = neutralize_backticks(js_trim(text))
    if len(guarded) <= limit:
        return guarded, False
    return guarded[: _grapheme_cut(guarded, limit)], True


def clip(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` code points, else cut on a grapheme boundary with ``…`` added,
    within ``limit`` in all: how the notice keeps to Discord's embed limits."""
    if len(text) <= limit:
        return text
    return text[: _grapheme_cut(text, limit - 1)] + "…"


def _grapheme_cut(text: str, limit: int) -> int:
    """The end of the last extended grapheme cluster of ``text`` that ends within ``limit`` code points."""
    # the clusters cover the text end to end: cut after the last one that ends within the limit
    cut = 0
    for cluster in _GRAPHEME.finditer(text, 0, limit + 1):
        if cluster.end() > limit:
            break
        cut = cluster.end()
    return cut


def mentioned_user_ids(content: str) -> set[str]:
    """Discord ids in the content's ``<@id>``, ``<@!id>`` and ``<@&id>`` mentions.

    The store loads these users so :func:`render_for_display` can show their saved nicknames.
    ``<@&id>`` is a role mention, but the original renders it as a user (see there).
    """
    return set(_USER_MENTION.findall(content))


def render_for_display(
    content: str,
    *,
    user_name: str | None,
    bot_nickname: str,
    bot_user_disc_id: str,
    users: Mapping[str, UserRecord],
    members: Mapping[str, GuildMember],
    personal_memories_enabled: bool,
) -> str:
    """``convertMentions`` for the notice: names for mentions, values for identity macros.

    In order:

    1. Discord channel links become ``<#channel>``.
    2. If the original text has no mention, no channel link and no identity macro written without
       inner whitespace (``{user}``, ``{{BOT}}``...), it is returned with only step 1 applied. This
       gate is the original's: ``{ user }`` alone stays literal, while ``{ user }`` next to a
       ``{bot}`` or a mention is expanded.
    3. ``<@id>``, ``<@!id>`` and ``<@&id>`` (a role, but the original's ``startsWith("<@")`` test sends
       it down the user branch): the bot's id shows ``bot_nickname``; another user shows their saved
       nickname when they are not blacklisted and personal memories are enabled, else their guild
       nickname, else their username, else the mention stays as written. ``<#id>`` stays as written:
       the worker knows no channel names (the original shows "the channel named ...").
    4. Macros ``bot``, ``user``, ``user_formatted``, ``user_term``, ``char`` in that order, double
       braces then single, case-insensitive, whitespace inside the braces allowed. ``user`` is
       ``user_name`` or ``"User"``, ``char`` is the bot's name; ``user_formatted`` and
       ``user_term`` have no value here and stay literal.

    Names inserted in step 3 go through step 4 as well, as in the original. Every name inserted is cut to
    256 characters (:func:`clip`), so a memory of 1000 characters renders to at most about 43,000 however long
    the names in the database are; the notice then keeps to Discord's limits (:func:`server_notice`).
    """
    normalized = _CHANNEL_LINK.sub(lambda link: f"<#{link.group(1)}>", content)
    if not (_MENTION.search(content) or _CHANNEL_LINK.search(content) or _STRICT_MACRO.search(content)):
        return normalized

    bot_name = clip(bot_nickname or DEFAULT_BOT_NAME, MAX_LABEL)

    def mention_name(mention: re.Match[str]) -> str:
        written, disc_id = mention.group(0), mention.group(1)
        if written.startswith("<#"):
            return written
        if disc_id == bot_user_disc_id:
            return bot_name
        record = users.get(disc_id)
        if record is not None and not record.blacklisted and personal_memories_enabled and record.nickname:
            return clip(record.nickname, MAX_LABEL)
        member = members.get(disc_id)
        if member is not None:
            return clip(member.nickname or member.username or written, MAX_LABEL)
        return written

    rendered = _MENTION.sub(mention_name, normalized)
    values = {"bot": bot_name, "user": clip(user_name or DEFAULT_USER_NAME, MAX_LABEL), "char": bot_name}
    for name in _MACRO_NAMES:
        value = values.get(name)
        if not value:
            continue
        for pattern in _MACRO_PATTERNS[name]:
            # A function replacement inserts the value literally; the original's string replacement
            # would read ``$&`` or ``$1`` in a name as a substitution pattern.
            rendered = pattern.sub(_literally(value), rendered)
    return rendered


def _literally(value: str) -> Callable[[re.Match[str]], str]:
    return lambda _match: value


def personal_footer(*, personal_memories_enabled: bool, target_blacklisted: bool) -> str:
    """The personal notice's footer: personalization disabled wins over blacklisted, else "manage"."""
    if not personal_memories_enabled:
        return PERSONAL_MEMORY_FOOTER_PERSONALIZATION_DISABLED
    if target_blacklisted:
        return PERSONAL_MEMORY_FOOTER_USER_BLACKLISTED
    return PERSONAL_MEMORY_FOOTER_MANAGE


def server_notice(
    *, title_name: str, rendered_content: str, preview_limit: int = MEMORY_NOTICE_PREVIEW_LIMIT
) -> Notice:
    """The notice for a server-wide memory.

    ``title_name`` is ``reply_via.username``, else the persona nickname (the caller's choice);
    ``rendered_content`` is the output of :func:`render_for_display`.
    """
    title = clip(f"🧠 {title_name or DEFAULT_TITLE_NAME} Learned Something New!", NOTICE_TITLE_LIMIT)
    head = f"A **[Server Memory]({MEMORY_DOCS_URL})** has been saved:\n"
    preview_room = _preview_room(title, head, SERVER_MEMORY_FOOTER)
    preview, expandable = build_preview(rendered_content, min(preview_limit, preview_room))
    return Notice(
        kind="server_memory",
        title=title,
        description=f"{head}{_fenced(preview)}",
        footer=SERVER_MEMORY_FOOTER,
        accent_color=NOTICE_ACCENT_COLOR,
        full_content=_full_content(rendered_content),
        expandable=expandable,
    )


def personal_notice(
    *,
    title_name: str,
    target_label: str,
    rendered_content: str,
    footer: str,
    preview_limit: int = MEMORY_NOTICE_PREVIEW_LIMIT,
) -> Notice:
    """The notice for a personal memory about ``target_label`` (the resolver's label for the target).

    ``footer`` comes from :func:`personal_footer`.
    """
    title = clip(
        f"💡 {title_name or DEFAULT_TITLE_NAME} Learned Something New about {target_label}!",
        NOTICE_TITLE_LIMIT,
    )
    head = (
        f"A **[Personal Memory]({MEMORY_DOCS_URL})** about {clip(target_label, MAX_LABEL)} has been saved:\n"
    )
    preview_room = _preview_room(title, head, footer)
    preview, expandable = build_preview(rendered_content, min(preview_limit, preview_room))
    return Notice(
        kind="personal_memory",
        title=title,
        description=f"{head}{_fenced(preview)}",
        footer=footer,
        accent_color=NOTICE_ACCENT_COLOR,
        full_content=_full_content(rendered_content),
        expandable=expandable,
    )


# The strings are built with f-strings, not the original localizer's sequential ``String.replace``:
# a ``$&`` or a later placeholder's text inside a name is shown as written, not substituted.
def _fenced(preview: str) -> str:
    return f"```\n{preview}\n```"


def _preview_room(title: str, head: str, footer: str) -> int:
    """Code points the preview may take so that the description and the whole embed keep to the limits."""
    fence = len(_fenced(""))
    return min(NOTICE_DESCRIPTION_LIMIT, EMBED_TOTAL_LIMIT - len(title) - len(footer)) - len(head) - fence


def _full_content(rendered_content: str) -> str:
    """The rendered content, fence-guarded, cut to what the "Show Full Memory" embed can show."""
    return clip(neutralize_backticks(js_trim(rendered_content)), NOTICE_FULL_CONTENT_LIMIT)
