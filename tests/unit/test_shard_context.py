"""`contracts.shard.build_context` (the TypeScript kit's `buildContext` in Python) against the contract's JSON
Schema: ids refused by field, the 1,000-member cut in the TypeScript kit's order, bounds checked; and the
Python test stack's seed, whose context names the member Sparrow as the TypeScript stack's does."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from contracts.example import EXAMPLE_EVENT
from contracts.shard import InvalidEventError, MemberInput, ParticipantInput, ReplyViaInput, build_context
from tests.factories import BOT, CHANNEL, GUILD, TRIGGER
from tests.schemas import assert_conforms, errors
from worker.testing.seed import MEMBER_LABEL, MEMBER_USERNAME, TryOut, discord_id

SPARROW = "1150000000000000201"


def as_event(context: dict[str, Any]) -> dict[str, Any]:
    """The contract's example event with this context: what the schema judges."""
    event = copy.deepcopy(EXAMPLE_EVENT)
    event["context"] = context
    return event


def base(**overrides: Any) -> dict[str, Any]:
    inputs: dict[str, Any] = {
        "guild_id": GUILD,
        "channel_id": CHANNEL,
        "user_id": TRIGGER,
        "bot_user_id": BOT,
        "persona_id": 7,
    }
    return build_context(**{**inputs, **overrides})


def test_the_context_is_the_contracts_in_every_shape() -> None:
    full = base(
        thread_id="1150000000000000300",
        reply_via=ReplyViaInput("1150000000000000400", "Tomori (alter)", "https://cdn.example/a.png"),
        participants=[
            ParticipantInput(SPARROW, "Master Sparrow", ("Sparrow", "sparrow_ow")),
            ParticipantInput("@alice:matrix.org", "Alice", ("Alice",), is_bridge=True),
        ],
        members=[MemberInput(SPARROW, "sparrow_ow", "Sparrow", nickname="Master Sparrow")],
    )
    assert_conforms("tool_call_event.v1.json", as_event(full))
    assert full["reply_via"] == {
        "webhook_disc_id": "1150000000000000400",
        "username": "Tomori (alter)",
        "avatar_url": "https://cdn.example/a.png",
    }
    assert full["participants"][1] == {
        "target_id": "@alice:matrix.org",
        "display_label": "Alice",
        "aliases": ["Alice"],
        "is_bridge": True,
    }
    assert full["guild_members"] == [
        {
            "user_disc_id": SPARROW,
            "username": "sparrow_ow",
            "global_name": "Sparrow",
            "nickname": "Master Sparrow",
            "is_bot": False,
        }
    ]
    direct = base(guild_id=None, user_id=None)
    assert_conforms("tool_call_event.v1.json", as_event(direct))
    assert (direct["guild_disc_id"], direct["triggering_user_disc_id"], direct["guild_members"]) == (
        None,
        None,
        [],
    )
    # the same keys as the contract's example context, no more
    assert set(direct) == set(EXAMPLE_EVENT["context"])


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"guild_id": "123"}, "guild_id"),
        ({"channel_id": 1150000000000000100}, "channel_id"),
        ({"user_id": "not-an-id"}, "user_id"),
        ({"bot_user_id": ""}, "bot_user_id"),
        ({"thread_id": "12"}, "thread_id"),
        ({"reply_via": ReplyViaInput("x", "Tomori")}, "reply_via.webhook_id"),
        ({"members": [MemberInput("1", "someone")]}, "members[0].user_id"),
        ({"participants": [ParticipantInput("", "nobody")]}, "participants[0].target_id"),
        ({"persona_id": -1}, "persona_id"),
        ({"persona_id": True}, "persona_id"),
    ],
)
def test_a_field_the_contract_refuses_is_named(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidEventError) as refused:
        base(**overrides)
    assert str(refused.value).startswith(f"{field} must be")


def test_a_bound_the_shard_broke_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(InvalidEventError, match="the context is not the contract's"):
        base(members=[MemberInput(SPARROW, "x" * 33)])
    too_many = [ParticipantInput(f"@p{n}:matrix.org", "P", is_bridge=True) for n in range(101)]
    with pytest.raises(InvalidEventError, match="participants"):
        base(participants=too_many)


def test_more_than_a_thousand_members_are_cut_participants_then_the_author_then_the_rest() -> None:
    others = [MemberInput(str(1150000000000010000 + n), f"member{n}") for n in range(1200)]
    late_participant = others[1100]
    author = MemberInput(TRIGGER, "author")
    members = [*others, author, others[3]]  # the author last, and a duplicate
    context = base(participants=[ParticipantInput(late_participant.user_id, "Late")], members=members)
    ids = [m["user_disc_id"] for m in context["guild_members"]]
    assert len(ids) == 1000 == len(set(ids))
    assert ids[:2] == [late_participant.user_id, TRIGGER]
    assert ids[2:] == [m.user_id for m in others[:998]]
    assert errors("tool_call_event.v1.json", as_event(context)) == []


def test_the_seed_context_names_sparrow_as_participant_and_member() -> None:
    try_out = TryOut(1, discord_id(), 2, 3, 4, discord_id(), discord_id(), discord_id(), 5, discord_id())
    context = try_out.context()
    assert_conforms("tool_call_event.v1.json", as_event(context))
    assert context["participants"] == [
        {
            "target_id": try_out.member_disc_id,
            "display_label": MEMBER_LABEL,
            "aliases": [MEMBER_LABEL, MEMBER_USERNAME],
            "is_bridge": False,
        }
    ]
    assert [m["user_disc_id"] for m in context["guild_members"]] == [try_out.member_disc_id]
    assert context["triggering_user_disc_id"] == try_out.user_disc_id
    assert try_out.context(participants=[])["participants"] == []
    body = try_out.event({"memory_content": "{user} likes cats"}, shard_id=3)
    assert_conforms("tool_call_event.v1.json", body)
