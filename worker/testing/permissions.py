"""What the stack's users may do: the worker's RabbitMQ grants (deploy/rabbitmq/definitions.json), a shard
user's (CONTRACT.md section 2), and the Redis users of deploy/redis/users.acl. tests/unit keeps each in step
with the file it copies.
"""

from __future__ import annotations

import os

from contracts.names import (
    INVALIDATION_CHANNEL,
    NOTIFICATIONS_EXCHANGE,
    TOOL_CALLS_EXCHANGE,
    TOOL_RESULTS_EXCHANGE,
)

__all__ = [
    "REDIS_USER_RULES",
    "WORKER_PERMISSIONS",
    "WORKER_TOPIC_PERMISSIONS",
    "redis_users",
    "shard_permissions",
    "shard_topic_permissions",
]


# The worker's grants in deploy/rabbitmq/definitions.json (tests/unit keeps the two in step).
WORKER_PERMISSIONS = {
    "configure": r"^(tomori\.(tool_calls|tool_results|notifications|dead_letter)"
    r"|ltm\.create_memory(\.dlq(\.copies)?|\.retry\.[0-9]+|\.shard\.[0-9]+)?)$",
    "write": r"^(tomori\.(tool_results|notifications|dead_letter)|amq\.default"
    r"|ltm\.create_memory(\.dlq(\.copies)?|\.shard\.[0-9]+)?)$",
    "read": r"^(tomori\.(tool_calls|dead_letter)"
    r"|ltm\.create_memory(\.dlq(\.copies)?|\.retry\.[0-9]+|\.shard\.[0-9]+)?)$",
}
WORKER_TOPIC_PERMISSIONS = (
    {
        "exchange": TOOL_CALLS_EXCHANGE,
        "write": "^$",
        "read": r"^tool\.(create_long_term_memory|remember_this_fact)(\.shard\.[0-9]+)?$",
    },
    {"exchange": TOOL_RESULTS_EXCHANGE, "write": r"^shard\.[0-9]+$", "read": "^$"},
    {"exchange": NOTIFICATIONS_EXCHANGE, "write": r"^shard\.[0-9]+$", "read": "^$"},
)


#: The Redis users of deploy/redis/users.acl, their rules after the password (tests/unit keeps them in step):
#: the worker may PUBLISH invalidations (PING and INFO for its probes and `worker check`), a shard may only
#: SUBSCRIBE to them (and PING); neither may touch a key.
REDIS_USER_RULES = {
    "worker": f"resetchannels &{INVALIDATION_CHANNEL} resetkeys -@all +publish +ping +info",
    "shard": f"resetchannels &{INVALIDATION_CHANNEL} resetkeys -@all +subscribe +ping",
}


def shard_permissions(shard_id: int) -> dict[str, str]:
    """What user `shard-<n>` may configure, write and read (CONTRACT.md section 2)."""
    own = rf"tomori\.shard\.{shard_id}\.(results|notifications)"
    return {
        "configure": rf"^{own}$",
        "write": rf"^(tomori\.tool_calls|{own})$",
        "read": rf"^(tomori\.(tool_results|notifications)|{own})$",
    }


def shard_topic_permissions(shard_id: int) -> list[dict[str, str]]:
    """The routing keys `shard-<n>` may publish and bind: `tool.<name>` and its own `tool.<name>.shard.<n>`
    out, `shard.<n>` in (deploy/rabbitmq/shard_users.py writes the same)."""
    own = rf"^shard\.{shard_id}$"
    tool_calls = rf"^tool\.[A-Za-z0-9_]+(\.shard\.{shard_id})?$"
    return [
        {"exchange": TOOL_CALLS_EXCHANGE, "write": tool_calls, "read": "^$"},
        {"exchange": TOOL_RESULTS_EXCHANGE, "write": "^$", "read": own},
        {"exchange": NOTIFICATIONS_EXCHANGE, "write": "^$", "read": own},
    ]


def redis_users() -> dict[str, tuple[str, str]]:
    """deploy/redis/users.acl's users, each with a random password."""
    return {name: (os.urandom(12).hex(), rules) for name, rules in REDIS_USER_RULES.items()}
