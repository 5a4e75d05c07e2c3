"""The contract's example event (CONTRACT.md section 3) and the ids it names, the exit codes, and how
``worker demo`` speaks (stdout, stderr)."""

from __future__ import annotations

import argparse
import copy
import sys
import uuid
from datetime import UTC, datetime
from typing import Any

from contracts.example import EXAMPLE_EVENT
from contracts.models import MAX_INT4
from worker.faults import explain
from worker.redact import redact_setting

# --- the contract's example (CONTRACT.md section 3) -----------------------------------------------------

GUILD = "1150000000000000001"
CHANNEL = "1150000000000000100"
AUTHOR = "1150000000000000200"
SPARROW = "1150000000000000201"
BOT = "1150000000000000999"
PERSONA_ID = 7
PERSONA_NICKNAME = "Tomori"
#: the shard ``send`` speaks as and ``clean`` cleans up after, unless ``--shard`` says another
DEFAULT_SHARD = 3
MAX_SHARD_ID = MAX_INT4
#: every demo event's tool_call_id starts so (``clean`` finds the demo's ledger rows by it)
TOOL_CALL_PREFIX = "demo_call_"
SERVER_CONTENT = "{user} likes dogs"
PERSONAL_CONTENT = "{user} prefers tea to coffee"

EXIT_OK = 0
EXIT_FAILED = 1  # a failure status, or the database refused the seed
EXIT_UNREACHABLE = 3  # Postgres or RabbitMQ unreachable, or no answer in time


def example_event(
    scope: str, content: str | None = None, *, event_id: str | None = None, shard: int = DEFAULT_SHARD
) -> dict[str, Any]:
    """CONTRACT.md section 3's example event with a fresh ``event_id``, sent by shard ``shard``.

    ``guild_members`` holds the author too: the notice names the author by what ``guild_members`` (or the
    author's saved nickname) says, and shows the bare Discord id otherwise (CONTRACT.md section 3, "members").
    ``target_user`` saves a personal memory about Sparrow.
    """
    if scope == "target_user":
        arguments: dict[str, Any] = {
            "memory_content": content or PERSONAL_CONTENT,
            "memory_scope": "target_user",
            "target_user": "Sparrow",
        }
    else:
        arguments = {"memory_content": content or SERVER_CONTENT, "memory_scope": "server_wide"}
    event = copy.deepcopy(EXAMPLE_EVENT)
    event.update(
        event_id=event_id or str(uuid.uuid4()),
        tool_call_id=TOOL_CALL_PREFIX + uuid.uuid4().hex[:12],
        issued_at=datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        shard_id=shard,
        arguments=arguments,
    )
    author = {"user_disc_id": AUTHOR, "username": "kaede_dc", "global_name": "Kaede", "nickname": None}
    event["context"]["guild_members"].insert(0, {**author, "is_bot": False})
    return event


def shard_id_argument(text: str) -> int:
    """``--shard N``: a shard id the contract allows."""
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_SHARD_ID:
        raise argparse.ArgumentTypeError(f"a shard id is an integer 0..{MAX_SHARD_ID}, not {text!r}")
    return int(text)


def say(line: str) -> None:
    print(line, flush=True)


def fail(line: str) -> None:
    print(f"worker demo: {line}", file=sys.stderr, flush=True)


def cannot_reach(dependency: str, url: str, exc: BaseException) -> None:
    """``cannot reach RabbitMQ at <url, password hidden>: <what to do>`` on stderr."""
    fail(f"cannot reach {dependency} at {redact_setting(url)}: {explain(exc, url)}")
