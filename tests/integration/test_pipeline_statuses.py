"""Every status of CONTRACT.md, each produced by the database state that causes it (real Postgres).

Every output these tests produce (result, notice, invalidation) is also held against the committed JSON
Schema files, so the schemas a shard generates its types from describe what the worker really sends.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from contracts.models import Status, ToolCallEvent, invalidation_id
from tests.factories import BOT, GUILD, TRIGGER, BotRows, event, member, participant, published
from tests.schemas import assert_conforms
from worker.config import Limits
from worker.service import process
from worker.service.process import ProcessedEvent

pytestmark = pytest.mark.integration

SPARROW = "1150000000000000201"
OTHER = "1150000000000000202"


async def process_event(pool: asyncpg.Pool, ev: ToolCallEvent, limits: Limits) -> ProcessedEvent:
    """One event processed, with every output it returns checked against the committed JSON Schemas."""
    done = await process.process_event(pool, ev, limits)
    assert_conforms("tool_result.v1.json", published(done.result))
    assert_conforms("tool_result.v1.json", published(done.as_replay().result))
    if done.notification is not None:
        assert_conforms("notification.v1.json", done.notification)
    if done.invalidation is not None:
        assert_conforms("cache_invalidation.v1.json", done.invalidation)
    return done


def server_args(content: str = "{user} likes dogs") -> dict[str, Any]:
    return {"memory_content": content, "memory_scope": "server_wide"}


def personal_args(target: str, content: str = "{user} likes cats") -> dict[str, Any]:
    return {"memory_content": content, "memory_scope": "target_user", "target_user": target}


def assert_failure(done: ProcessedEvent, status: str, error: str, **data: Any) -> None:
    result = published(done.result)
    assert result["success"] is False
    assert result["status"] == status
    assert result["message"] is None
    assert result["error"] == error
    assert result["data"]["status"] == status
    for key, value in data.items():
        assert result["data"][key] == value, key
    assert done.notification is None
    assert done.invalidation is None
    assert done.memory_id is None


async def test_server_wide_save_writes_the_row_and_every_output(pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world()
    ev = event(server_args(), persona_id=world.persona_id)

    done = await process_event(pool, ev, Limits())

    result = published(done.result)
    assert result["success"] is True
    assert result["status"] == Status.SAVED
    assert result["message"] == "Memory saved successfully"
    assert result["error"] is None
    assert result["replayed"] is False
    assert result["event_id"] == str(ev.event_id)
    assert result["tool_call_id"] == ev.tool_call_id
    assert result["tool_name"] == "create_long_term_memory"
    assert result["data"] == {
        "status": Status.SAVED,
        "scope": "server_wide",
        "memory_id": done.memory_id,
        "content_saved": "{user} likes dogs",
    }
    row = await rows.conn.fetchrow(
        "SELECT * FROM server_memories WHERE server_memory_id = $1", done.memory_id
    )
    assert row["server_id"] == world.server_id
    assert row["persona_id"] == world.persona_id
    assert row["persona_lineage_id"] == world.lineage_id
    assert row["user_id"] == world.trigger_user_id
    assert row["content"] == "{user} likes dogs"
    assert row["tags"] == []
    assert done.invalidation == {
        "schema_version": 1,
        "invalidation_id": invalidation_id(ev.event_id),
        "kind": "tomori_state",
        "server_disc_id": GUILD,
    }
    assert done.notification is not None
    notice = done.notification["notice"]
    assert notice["kind"] == "server_memory"
    assert notice["title"] == "🧠 Tomori Learned Something New!"
    assert notice["footer"] == "Server managers can manage this memory using `/memories`."
    # {user} renders as the triggering user's id: no saved nickname, not in guild_members or participants
    assert notice["full_content"] == f"{TRIGGER} likes dogs"
    assert done.notification["channel_disc_id"] == ev.context.channel_disc_id


async def test_alias_tool_name_is_echoed(pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world()
    done = await process_event(
        pool, event(server_args(), persona_id=world.persona_id, tool_name="remember_this_fact"), Limits()
    )
    assert published(done.result)["tool_name"] == "remember_this_fact"


async def test_personal_save_for_a_known_guild_member(pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world()
    target_id = await rows.user(SPARROW)
    ev = event(
        personal_args("Sparrow"),
        persona_id=world.persona_id,
        members=[member(SPARROW, "sparrow_ow", "Sparrow")],
    )

    done = await process_event(pool, ev, Limits())

    assert published(done.result)["data"] == {
        "status": Status.SAVED,
        "scope": "target_user",
        "target_user": "Sparrow (@sparrow_ow)",
        "memory_id": done.memory_id,
        "content_saved": "{user} likes cats",
    }
    row = await rows.conn.fetchrow(
        "SELECT * FROM personal_memories WHERE personal_memory_id = $1", done.memory_id
    )
    assert (row["user_id"], row["persona_lineage_id"], row["content"]) == (
        target_id,
        world.lineage_id,
        "{user} likes cats",
    )
    assert done.invalidation == {
        "schema_version": 1,
        "invalidation_id": invalidation_id(ev.event_id),
        "kind": "user",
        "user_disc_id": SPARROW,
    }
    notice = done.notification["notice"]  # type: ignore[index]
    assert notice["kind"] == "personal_memory"
    assert notice["title"] == "💡 Tomori Learned Something New about Sparrow (@sparrow_ow)!"
    assert notice["full_content"] == "Sparrow (@sparrow_ow) likes cats"
    assert notice["footer"] == "You can manage your personal memories using `/personal memories`."


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ([1, 2], "Invalid parameters: arguments must be an object"),
        ("remember this", "Invalid parameters: arguments must be an object"),
        (None, "Invalid parameters: arguments must be an object"),
        ({"memory_content": "x"}, "Invalid parameters: Missing required parameters: memory_scope"),
        (
            {"memory_scope": "server_wide", "memory_content": None},
            "Invalid parameters: Missing required parameters: memory_content",
        ),
        ({}, "Invalid parameters: Missing required parameters: memory_content, memory_scope"),
        (
            {"memory_content": 5, "memory_scope": "server_wide"},
            "Invalid parameters: Parameter 'memory_content' expected type 'string' but got 'number'",
        ),
        (
            {"memory_content": "x", "memory_scope": "Server_Wide"},
            "Invalid parameters: Parameter 'memory_scope' must be one of: server_wide, target_user",
        ),
        (
            {"memory_content": ["x"], "memory_scope": "everyone", "target_user": {}},
            "Invalid parameters: Parameter 'memory_content' expected type 'string' but got 'array', "
            "Parameter 'memory_scope' must be one of: server_wide, target_user, "
            "Parameter 'target_user' expected type 'string' but got 'object'",
        ),
        (
            {"memory_scope": True},
            "Invalid parameters: Parameter 'memory_scope' expected type 'string' but got 'boolean'",
        ),
        (
            {"memory_content": "x", "memory_scope": "target_user", "target_user_nickname": 42},
            "Invalid parameters: Parameter 'target_user_nickname' expected type 'string' but got 'number'",
        ),
    ],
)
async def test_invalid_arguments(pool: asyncpg.Pool, rows: BotRows, arguments: Any, error: str) -> None:
    world = await rows.world()
    done = await process_event(pool, event(arguments, persona_id=world.persona_id), Limits())
    assert_failure(done, Status.INVALID_ARGS, error, reason=error)
    assert set(published(done.result)["data"]) == {"status", "reason"}


async def test_blank_content_is_invalid_after_trim(pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world()
    done = await process_event(pool, event(server_args(" \n\t "), persona_id=world.persona_id), Limits())
    sentence = "The 'memory_content' argument was missing, empty, or not a string"
    assert_failure(done, Status.INVALID_ARGS, sentence, reason=sentence)


async def test_target_scope_without_a_target(pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world()
    args = {"memory_content": "x", "memory_scope": "target_user", "target_user": "  "}
    done = await process_event(pool, event(args, persona_id=world.persona_id), Limits())
    sentence = "The 'target_user' argument is required when 'memory_scope' is 'target_user'."
    assert_failure(done, Status.INVALID_ARGS, sentence, scope="target_user", reason=sentence)


async def test_legacy_target_names_are_read_in_order(pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world()
    await rows.user(SPARROW)
    args = {
        "memory_content": "x",
        "memory_scope": "target_user",
        "target_user": " ",
        "target_user_nickname": "",
        "target_user_discord_id": SPARROW,
    }
    done = await process_event(
        pool, event(args, persona_id=world.persona_id, members=[member(SPARROW, "sparrow")]), Limits()
    )
    assert published(done.result)["data"]["target_user"] == "sparrow"


async def test_self_teaching_disabled(pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world(self_teaching=False)
    done = await process_event(pool, event(server_args(), persona_id=world.persona_id), Limits())
    assert_failure(
        done,
        Status.DISABLED,
        "Self-teaching is disabled for this server",
        reason="Self-teaching functionality is disabled for this server",
    )


CRITICAL = "Internal bot error: Critical state information is missing"


async def test_critical_state_no_server_row(pool: asyncpg.Pool, rows: BotRows) -> None:
    done = await process_event(pool, event(server_args(), persona_id=1), Limits())
    assert_failure(done, Status.INTERNAL_ERROR, CRITICAL, reason=CRITICAL)


async def test_critical_state_persona_of_another_server(pool: asyncpg.Pool, rows: BotRows) -> None:
    await rows.world()
    elsewhere = await rows.server("1150000000000000002")
    foreign_persona, _ = await rows.persona(elsewhere, "Other")
    done = await process_event(pool, event(server_args(), persona_id=foreign_persona), Limits())
    assert_failure(done, Status.INTERNAL_ERROR, CRITICAL)


async def test_critical_state_unknown_persona(pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world()
    done = await process_event(pool, event(server_args(), persona_id=world.persona_id + 100), Limits())
    assert_failure(done, Status.INTERNAL_ERROR, CRITICAL)


async def test_critical_state_trigger_without_users_row(pool: asyncpg.Pool, rows: BotRows) -> None:
    server_id = await rows.server()
    persona_id, _ = await rows.persona(server_id)
    done = await process_event(pool, event(server_args(), persona_id=persona_id), Limits())
    assert_failure(done, Status.INTERNAL_ERROR, CRITICAL)


async def test_critical_state_unknown_trigger(pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world()
    done = await process_event(
        pool, event(server_args(), persona_id=world.persona_id, trigger=None), Limits()
    )
    assert_failure(done, Status.INTERNAL_ERROR, CRITICAL)


async def test_arguments_are_judged_before_critical_state(pool: asyncpg.Pool, rows: BotRows) -> None:
    done = await process_event(pool, event({"memory_content": "x"}, persona_id=1), Limits())
    assert published(done.result)["status"] == Status.INVALID_ARGS


async def test_empty_content_is_judged_after_critical_state_as_the_original_does(
    pool: asyncpg.Pool, rows: BotRows
) -> None:
    """Security review 4, N11, decided (docs/decisions.md): SPEC.md's order, the original's, is kept. An
    empty ``memory_content`` is answered from the state: the rows present, ``invalid_args``; a guild, a
    persona of that guild or an author without a row, the critical-state sentence. Nothing is written."""
    world = await rows.world()
    empty = server_args("   ")
    sentence = "The 'memory_content' argument was missing, empty, or not a string"

    present = await process_event(pool, event(empty, persona_id=world.persona_id), Limits())
    no_guild = await process_event(pool, event(empty, persona_id=world.persona_id, guild=OTHER), Limits())
    no_persona = await process_event(pool, event(empty, persona_id=world.persona_id + 999), Limits())
    no_author = await process_event(pool, event(empty, persona_id=world.persona_id, trigger=OTHER), Limits())

    assert_failure(present, Status.INVALID_ARGS, sentence, reason=sentence)
    for done in (no_guild, no_persona, no_author):
        assert_failure(done, Status.INTERNAL_ERROR, CRITICAL)
    assert await rows.conn.fetchval("SELECT count(*) FROM server_memories") == 0


async def test_ambiguous_target(pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world()
    members = [
        member(SPARROW, "sparrow_a", "Sparrow"),
        member(OTHER, "sparrow_b", "Sparrow"),
        member("1150000000000000203", "sparrow_c", "Sparrow"),
        member("1150000000000000204", "sparrow_d", "Sparrow"),
    ]
    done = await process_event(
        pool, event(personal_args("  Sparrow "), persona_id=world.persona_id, members=members), Limits()
    )
    labels = ["Sparrow (@sparrow_a)", "Sparrow (@sparrow_b)", "Sparrow (@sparrow_c)"]
    assert_failure(
        done,
        Status.AMBIGUOUS_USER,
        'Multiple users match "Sparrow". Please clarify which one you mean: ' + ", ".join(labels) + ".",
        scope="target_user",
        reason="Multiple users matched the requested target.",
        candidates=labels,
    )


async def test_target_not_found(pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world()
    done = await process_event(
        pool,
        event(
            personal_args(" Nobody  Here "), persona_id=world.persona_id, members=[member(SPARROW, "sparrow")]
        ),
        Limits(),
    )
    assert_failure(
        done,
        Status.USER_NOT_FOUND,
        'Could not find a user matching "Nobody  Here" in this conversation or server.',
        scope="target_user",
        reason="The requested user was not found in this conversation or server.",
    )


async def test_content_too_long_counts_utf16_units(pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world()
    limits = Limits(max_memory_length=10)
    fits = await process_event(pool, event(server_args("🐶" * 5), persona_id=world.persona_id), limits)
    assert published(fits.result)["success"] is True
    too_long = await process_event(
        pool, event(server_args("🐶" * 5 + "a"), persona_id=world.persona_id), limits
    )
    assert_failure(
        too_long,
        Status.INVALID_CONTENT,
        "Memory content is too long. Maximum length is 10 characters.",
        reason="Memory content exceeds maximum length of 10 characters",
    )


async def test_persona_with_lineage_zero(pool: asyncpg.Pool, rows: BotRows) -> None:
    server_id = await rows.server()
    persona_id, _ = await rows.persona(server_id, lineage=0)
    await rows.user(TRIGGER)
    done = await process_event(pool, event(server_args(), persona_id=persona_id), Limits())
    assert_failure(
        done,
        Status.INTERNAL_ERROR,
        "Internal configuration error: this persona has an invalid lineage ID.",
        reason="Persona lineage ID is 0, which is reserved for global memories. "
        "Schema migration may not have run.",
    )
    assert await rows.conn.fetchval("SELECT count(*) FROM server_memories") == 0


async def test_server_limit_reached(pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world()
    await rows.server_memories(world.server_id, world.lineage_id, 3)
    await rows.server_memories(world.server_id, world.lineage_id + 1, 5)  # another lineage: not counted
    done = await process_event(
        pool, event(server_args(), persona_id=world.persona_id), Limits(max_server_memories=3)
    )
    assert_failure(
        done,
        Status.LIMIT_EXCEEDED,
        "Server memory limit reached. This server can have up to 3 memories (currently: 3).",
        scope="server_wide",
        current_count=3,
        max_allowed=3,
        reason="Server memory limit of 3 memories has been reached. Please inform the user that they need to "
        "use '/memories' to remove some memories before I can learn new ones.",
    )


async def test_personal_target_unknown_to_the_bot(pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world()
    done = await process_event(
        pool,
        event(personal_args("Sparrow"), persona_id=world.persona_id, members=[member(SPARROW, "sparrow")]),
        Limits(),
    )
    assert_failure(
        done,
        Status.USER_NOT_FOUND,
        "I don't know sparrow yet, so I cannot save a personal memory for them.",
        scope="target_user",
        reason="I can only save personal memories for users I already know.",
    )


@pytest.mark.parametrize("level", [1, 2])
async def test_privacy_restricted(pool: asyncpg.Pool, rows: BotRows, level: int) -> None:
    world = await rows.world()
    await rows.user(SPARROW, privacy=level)
    done = await process_event(
        pool,
        event(personal_args("sparrow"), persona_id=world.persona_id, members=[member(SPARROW, "sparrow")]),
        Limits(),
    )
    assert_failure(
        done,
        Status.PRIVACY_RESTRICTED,
        "Cannot save personal memory: sparrow has privacy restrictions.",
        scope="target_user",
        reason="The user sparrow has chosen to restrict personal memory storage. I cannot save personal "
        "memories about them unless they change their privacy settings using '/personal config'.",
    )


async def test_personal_limit_counts_lineage_zero(pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world()
    target_id = await rows.user(SPARROW)
    await rows.personal_memories(target_id, world.lineage_id, 2)
    await rows.personal_memories(target_id, 0, 1)
    await rows.personal_memories(target_id, world.lineage_id + 7, 4)  # another persona lineage
    done = await process_event(
        pool,
        event(personal_args("sparrow"), persona_id=world.persona_id, members=[member(SPARROW, "sparrow")]),
        Limits(max_personal_memories=3),
    )
    assert_failure(
        done,
        Status.LIMIT_EXCEEDED,
        "Personal memory limit reached. Users can have up to 3 personal memories (currently: 3).",
        scope="target_user",
        target_user="sparrow",
        current_count=3,
        max_allowed=3,
        reason="Personal memory limit of 3 memories has been reached for this user. Please inform the user "
        "that they need to use '/personal memories' to remove some of their memories before I can learn "
        "new ones about them.",
    )


async def test_target_that_is_the_bot_falls_back_to_server_wide(pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world()
    ev = event(
        personal_args(BOT, "{bot} likes tea"),
        persona_id=world.persona_id,
        participants=[participant(BOT, "Tomori", ["Tomori"])],
    )
    done = await process_event(pool, ev, Limits())
    assert published(done.result)["data"]["scope"] == "server_wide"
    assert published(done.result)["data"]["content_saved"] == "{bot} likes tea"
    assert done.invalidation is not None
    assert done.invalidation["kind"] == "tomori_state"


async def test_bridge_target_substitutes_user_and_saves_server_wide(
    pool: asyncpg.Pool, rows: BotRows
) -> None:
    world = await rows.world()
    ev = event(
        personal_args("Alice", "{user} likes {User} and {user}"),
        persona_id=world.persona_id,
        participants=[participant("@alice:matrix.org", "Alice", ["Alice"], is_bridge=True)],
    )
    done = await process_event(pool, ev, Limits())
    assert published(done.result)["data"]["scope"] == "server_wide"
    assert published(done.result)["data"]["content_saved"] == "Alice likes {User} and Alice"
    stored = await rows.conn.fetchval("SELECT content FROM server_memories")
    assert stored == "Alice likes {User} and Alice"


async def test_direct_message_uses_the_users_own_server_row(pool: asyncpg.Pool, rows: BotRows) -> None:
    server_id = await rows.server(TRIGGER)  # the DM "server" is keyed by the user's Discord id
    persona_id, _ = await rows.persona(server_id)
    await rows.user(TRIGGER, nickname="Sparrow")
    done = await process_event(pool, event(server_args(), persona_id=persona_id, guild=None), Limits())
    assert published(done.result)["success"] is True
    assert done.invalidation == {
        "schema_version": 1,
        "invalidation_id": invalidation_id(done.result.event_id),
        "kind": "tomori_state",
        "server_disc_id": TRIGGER,
    }
    assert done.notification is not None
    assert done.notification["notice"]["full_content"] == "Sparrow likes dogs"


async def test_content_is_trimmed_and_sanitised_before_saving(pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world()
    done = await process_event(
        pool,
        event(server_args("  {User} calls {bot} {{nickname}} and {first}  "), persona_id=world.persona_id),
        Limits(),
    )
    assert published(done.result)["data"]["content_saved"] == "{User} calls {bot} nickname and first"


async def test_personal_footer_follows_server_flags_and_blacklist(pool: asyncpg.Pool, rows: BotRows) -> None:
    world = await rows.world(personal=False)
    await rows.user(SPARROW)
    done = await process_event(
        pool,
        event(personal_args("sparrow"), persona_id=world.persona_id, members=[member(SPARROW, "sparrow")]),
        Limits(),
    )
    assert done.notification is not None
    assert done.notification["notice"]["footer"].startswith(
        "This memory was saved, but personalization features are currently disabled on this server"
    )
    await rows.user(OTHER)
    await rows.blacklist(world.server_id, OTHER)
    await rows.conn.execute("UPDATE server_member_permissions_configs SET personal_memories_enabled = true")
    done = await process_event(
        pool,
        event(personal_args("other"), persona_id=world.persona_id, members=[member(OTHER, "other")]),
        Limits(),
    )
    assert done.notification is not None
    assert done.notification["notice"]["footer"].startswith(
        "This memory was saved, but the user in question is currently blacklisted"
    )
