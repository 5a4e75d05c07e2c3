"""CONTRACT.md's example body of a "Tool-call event" (section 3), comments removed, ``{ ... }`` filled in.

The schema tests check that the models and the JSON schema accept it; ``worker demo send`` sends a copy with
a fresh event id. Change it only together with the example in CONTRACT.md.
"""

from __future__ import annotations

from typing import Any

EXAMPLE_EVENT: dict[str, Any] = {
    "schema_version": 1,
    "event_id": "6f1c1a9e-3b0e-4a53-9a55-6a4f0f0b9a11",
    "tool_call_id": "call_8731",
    "tool_name": "create_long_term_memory",
    "issued_at": "2026-12-02T08:00:00Z",
    "shard_id": 3,
    "arguments": {"memory_content": "{user} likes dogs", "memory_scope": "server_wide"},
    "context": {
        "guild_disc_id": "1150000000000000001",
        "channel_disc_id": "1150000000000000100",
        "thread_id": None,
        "triggering_user_disc_id": "1150000000000000200",
        "bot_user_disc_id": "1150000000000000999",
        "persona_id": 7,
        "reply_via": None,
        "participants": [
            {
                "target_id": "1150000000000000201",
                "display_label": "Master Sparrow",
                "aliases": ["Sparrow", "sparrow_ow", "Master Sparrow"],
                "is_bridge": False,
            },
            {
                "target_id": "@alice:matrix.org",
                "display_label": "Alice",
                "aliases": ["Alice"],
                "is_bridge": True,
            },
        ],
        "guild_members": [
            {
                "user_disc_id": "1150000000000000201",
                "username": "sparrow_ow",
                "global_name": "Sparrow",
                "nickname": None,
                "is_bot": False,
            }
        ],
    },
}
