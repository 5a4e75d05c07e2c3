"""The workload's vocabulary: the statuses the events must end as, the categories' mix, the words the
contents are made of, and the refusal of a world too small to stage them (bench/workload.py builds the
events, bench/workload_drafts.py drafts each)."""

from __future__ import annotations

from contracts.models import Status

# the contract's statuses, under the short names the workload's expectations use
SAVED = Status.SAVED
INVALID_ARGS = Status.INVALID_ARGS
INVALID_CONTENT = Status.INVALID_CONTENT
DISABLED = Status.DISABLED
LIMIT_EXCEEDED = Status.LIMIT_EXCEEDED
AMBIGUOUS = Status.AMBIGUOUS_USER
NOT_FOUND = Status.USER_NOT_FOUND
PRIVACY = Status.PRIVACY_RESTRICTED
INTERNAL = Status.INTERNAL_ERROR

TOOL = "create_long_term_memory"
ALIAS = "remember_this_fact"
#: events racing for the last free slots of one contested personal scope, and how many slots are left
CONTESTED_BURST = 6
CONTESTED_ROOM = 3

#: category -> relative weight. Personal saves go through every stage of the resolver's ladder.
MIX: dict[str, float] = {
    "server_wide": 26,
    "personal_discord_id": 3,
    "personal_conversation": 5,
    "personal_display_name": 8,
    "personal_persona_nickname": 3,
    "personal_saved_nickname": 3,
    "personal_global_name": 3,
    "personal_username": 3,
    "personal_persona_affix": 3,
    "personal_composed_name": 2,
    "bridge_user": 2,
    "bot_itself": 2,
    "server_limit": 2,
    "personal_limit": 2,
    "contested_limit": 0.4,  # each draw is a burst of CONTESTED_BURST events
    "invalid_args": 6,
    "too_long": 1,
    "ambiguous_name": 2,
    "unknown_name": 2,
    "unknown_user": 1,
    "privacy_restricted": 2,
    "disabled_server": 2,
    "unknown_trigger": 0.5,
}
UNKNOWN_NAMES = ("Grumpy Walrus", "Blue Fox", "Stranger Danger", "Plum Wizard", "Crispy Toast")
THINGS = (
    "dogs",
    "rainy mornings",
    "spicy ramen",
    "the colour green",
    "jazz",
    "rock climbing",
    "old maps",
    "chess openings",
    "night shifts",
    "strawberry milk",
    "horror films",
    "gardening",
    "retro consoles",
)
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")  # fmt: skip


class WorldTooSmall(RuntimeError):
    """The world has no room left for the saves the workload needs."""
