#!/usr/bin/env python3
"""One RabbitMQ user per bot shard, confined to that shard's queues and routing keys (deploy/README.md).

User ``shard-<N>`` may declare, delete, bind, consume, get and purge only ``tomori.shard.<N>.results`` and
``tomori.shard.<N>.notifications``, bind them only with the key ``shard.<N>``, and publish tool calls
(``tool.<name>``, or its own ``tool.<name>.shard.<N>``) to ``tomori.tool_calls``. RabbitMQ expands no
variables in configure/write/read patterns (only in topic permissions), so each shard needs permissions of
its own: this script writes them.

Standard library only, so it runs anywhere:

    # rabbitmqctl commands for shards 0 to 3 (each password from SHARD_<N>_PASSWORD in the environment)
    python3 deploy/rabbitmq/shard_users.py commands 0-3
    # the users as definitions (asks each password; `--passwords -` reads one line per shard from stdin),
    # or the whole file with them added: --merge deploy/rabbitmq/definitions.json
    python3 deploy/rabbitmq/shard_users.py definitions 0-3
"""

from __future__ import annotations

import argparse
import base64
import getpass
import hashlib
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

TOOL_CALLS = "tomori.tool_calls"
RESULTS = "tomori.tool_results"
NOTIFICATIONS = "tomori.notifications"
QUEUE_KINDS = ("results", "notifications")
NOTHING = "^$"


def user_name(shard_id: int) -> str:
    return f"shard-{shard_id}"


def _own_queues(shard_id: int) -> str:
    return rf"tomori\.shard\.{shard_id}\.(results|notifications)"


def tool_call_keys(shard_id: int) -> str:
    """A shard publishes tool calls with `tool.<name>` or its own `tool.<name>.shard.<N>` keys, and never
    binds to `tomori.tool_calls`."""
    return rf"^tool\.[A-Za-z0-9_]+(\.shard\.{shard_id})?$"


def permissions(shard_id: int) -> dict[str, str]:
    """configure / write / read of shard `shard_id` (the regexes RabbitMQ matches resource names with)."""
    own = _own_queues(shard_id)
    return {
        # declare and delete its two queues, nothing else (no exchanges, no server-named queues)
        "configure": rf"^{own}$",
        # publish to tomori.tool_calls; bind into its own queues
        "write": rf"^(tomori\.tool_calls|{own})$",
        # consume, get, purge its own queues; bind them from the results and notifications exchanges
        "read": rf"^(tomori\.(tool_results|notifications)|{own})$",
    }


def topic_permissions(shard_id: int) -> list[dict[str, str]]:
    """Routing keys per topic exchange: `read` is checked on queue.bind and exchange.bind, `write` on publish
    (measured on RabbitMQ 3.10.8)."""
    own_key = rf"^shard\.{shard_id}$"
    return [
        {"exchange": TOOL_CALLS, "write": tool_call_keys(shard_id), "read": NOTHING},
        {"exchange": RESULTS, "write": NOTHING, "read": own_key},
        {"exchange": NOTIFICATIONS, "write": NOTHING, "read": own_key},
    ]


def password_hash(password: str, salt: bytes | None = None) -> str:
    """RabbitMQ's ``rabbit_password_hashing_sha256``: base64(salt + sha256(salt + password))."""
    salt = os.urandom(4) if salt is None else salt
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode("utf-8")).digest()).decode("ascii")


def definitions(shard_ids: list[int], vhost: str, passwords: dict[int, str]) -> dict[str, Any]:
    """The `users`, `permissions` and `topic_permissions` of definitions.json for these shards."""
    users, grants, topics = [], [], []
    for shard_id in shard_ids:
        name = user_name(shard_id)
        users.append(
            {
                "name": name,
                "password_hash": password_hash(passwords[shard_id]),
                "hashing_algorithm": "rabbit_password_hashing_sha256",
                "tags": [],
                "limits": {},
            }
        )
        grants.append({"user": name, "vhost": vhost, **permissions(shard_id)})
        topics.extend({"user": name, "vhost": vhost, **topic} for topic in topic_permissions(shard_id))
    return {"users": users, "permissions": grants, "topic_permissions": topics}


def merge(base: dict[str, Any], shards: dict[str, Any]) -> dict[str, Any]:
    """`base` (a definitions file) with the shard users added; entries of the same users are replaced."""
    names = {user["name"] for user in shards["users"]}
    merged = dict(base)
    merged["users"] = [u for u in base.get("users", []) if u["name"] not in names] + shards["users"]
    for key in ("permissions", "topic_permissions"):
        kept = [entry for entry in base.get(key, []) if entry["user"] not in names]
        merged[key] = kept + shards[key]
    return merged


def commands(shard_ids: list[int], vhost: str) -> list[str]:
    """rabbitmqctl command lines creating the users; each password comes from `SHARD_<N>_PASSWORD`."""
    lines = []
    for shard_id in shard_ids:
        name = shlex.quote(user_name(shard_id))
        lines.append(f'rabbitmqctl add_user {name} "${{SHARD_{shard_id}_PASSWORD:?}}"')
        grant = permissions(shard_id)
        regexes = " ".join(shlex.quote(grant[kind]) for kind in ("configure", "write", "read"))
        lines.append(f"rabbitmqctl set_permissions -p {shlex.quote(vhost)} {name} {regexes}")
        for topic in topic_permissions(shard_id):
            lines.append(
                f"rabbitmqctl set_topic_permissions -p {shlex.quote(vhost)} {name} "
                f"{shlex.quote(topic['exchange'])} {shlex.quote(topic['write'])} {shlex.quote(topic['read'])}"
            )
    return lines


def shard_ids(specs: list[str]) -> list[int]:
    """`3`, `0-15` or several of them: the shard ids, in order, each once."""
    ids: list[int] = []
    for spec in specs:
        first, _, last = spec.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            raise argparse.ArgumentTypeError(f"not a shard id or range: {spec!r}")
        low, high = int(first), int(last or first)
        if high < low:
            raise argparse.ArgumentTypeError(f"empty range: {spec!r}")
        ids.extend(i for i in range(low, high + 1) if i not in ids)
    return ids


def read_passwords(ids: list[int], source: str | None) -> dict[int, str]:
    if source == "-":
        lines = sys.stdin.read().splitlines()
        if len(lines) < len(ids):
            raise SystemExit(f"{len(ids)} passwords needed on stdin (one per line), got {len(lines)}")
        passwords = dict(zip(ids, lines, strict=False))
    else:
        passwords = {i: getpass.getpass(f"password of {user_name(i)}: ") for i in ids}
    empty = [user_name(i) for i, password in passwords.items() if not password]
    if empty:
        raise SystemExit(f"empty password refused: {', '.join(empty)}")
    return passwords


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="shard_users.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("commands", "definitions"))
    parser.add_argument("shards", nargs="+", help="shard ids or ranges: 0 1 2, 0-15")
    parser.add_argument("--vhost", default="/", help="the vhost of the worker's topology (default /)")
    parser.add_argument(
        "--passwords", choices=("-",), help="definitions: read one password per line from stdin"
    )
    parser.add_argument(
        "--merge", type=Path, metavar="FILE", help="definitions: print FILE with the users in it"
    )
    args = parser.parse_args(argv[1:])
    try:
        ids = shard_ids(args.shards)
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    if args.what == "commands":
        print("\n".join(commands(ids, args.vhost)))
        return 0
    output = definitions(ids, args.vhost, read_passwords(ids, args.passwords))
    if args.merge is not None:
        output = merge(json.loads(args.merge.read_text(encoding="utf-8")), output)
    print(json.dumps(output, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
