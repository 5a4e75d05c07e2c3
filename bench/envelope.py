"""``python -m bench.envelope``: how long the worst single bodies hold the event loop while they are read.

Times :func:`worker.broker.envelope.read_event` (the only synchronous work a delivery does before its first
``await``) on the bodies of security-review-3 sections 1 and 3 and on the heaviest bodies the contract allows,
and prints, per body, its size, what it reads as, and the median and worst time over ``--runs`` runs.
Nothing here asserts a figure: the numbers are for BENCHMARKS.md and the closing note.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson

from contracts.models import MAX_BODY_BYTES
from worker.broker.envelope import Unreadable, read_event

GUILD, CHANNEL, TRIGGER, BOT = (
    "1150000000000000001",
    "1150000000000000100",
    "1150000000000000200",
    "1150000000000000999",
)


def _event(arguments: Any = None, **context: Any) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "event_id": str(uuid.uuid4()),
        "tool_call_id": "call_8731",
        "tool_name": "create_long_term_memory",
        "issued_at": "2026-12-02T08:00:00Z",
        "shard_id": 3,
        "arguments": arguments
        if arguments is not None
        else {"memory_content": "{user} likes dogs", "memory_scope": "server_wide"},
        "context": {
            "guild_disc_id": GUILD,
            "channel_disc_id": CHANNEL,
            "thread_id": None,
            "triggering_user_disc_id": TRIGGER,
            "bot_user_disc_id": BOT,
            "persona_id": 7,
            "reply_via": None,
            "participants": [],
            "guild_members": [],
            **context,
        },
    }


def _dump(body: dict[str, Any]) -> bytes:
    return orjson.dumps(body)


def _with_raw_arguments(raw: bytes) -> bytes:
    """An event whose ``arguments`` is ``raw`` (JSON text orjson may not take), the rest valid."""
    marker = '"@@ARGS@@"'
    text = orjson.dumps(_event(arguments="@@ARGS@@")).replace(marker.encode(), raw)
    return text


def _fill(prefix: bytes, unit: bytes, suffix: bytes, limit: int = MAX_BODY_BYTES) -> bytes:
    room = limit - len(prefix) - len(suffix)
    return prefix + unit * (room // len(unit)) + suffix


def _members(n: int, name_len: int) -> list[dict[str, Any]]:
    return [
        {
            "user_disc_id": f"{1150000000000001000 + i}",
            "username": f"u{i}".ljust(name_len, "x"),
            "global_name": f"g{i}".ljust(name_len, "y"),
            "nickname": f"n{i}".ljust(name_len, "z"),
            "is_bot": False,
        }
        for i in range(n)
    ]


def _participants(n: int, aliases: int, length: int) -> list[dict[str, Any]]:
    return [
        {
            "target_id": f"{1150000000000002000 + i}",
            "display_label": f"p{i}".ljust(length, "q"),
            "aliases": [f"a{i}.{k}".ljust(length, "r") for k in range(aliases)],
            "is_bridge": False,
        }
        for i in range(n)
    ]


def bodies() -> dict[str, bytes]:
    """The bodies timed, by name (each at most 256 KiB, so every one is read)."""
    deep = 10_000
    found: dict[str, bytes] = {
        # security-review-3 section 3: 60 of these blocked the loop ~0.33 s each
        "participants [0]*120000 (240 KB)": _dump(_event(participants=[0] * 120_000)),
        "guild_members 100,000 ints": _dump(_event(guild_members=[0] * 100_000)),
        "guild_members 40,000 empty objects": _dump(_event(guild_members=[{}] * 40_000)),
        "participants 40,000 empty objects": _dump(_event(participants=[{}] * 40_000)),
        "aliases 60,000 empty strings": _dump(
            _event(participants=[{"target_id": "1", "display_label": "x", "aliases": [""] * 60_000}])
        ),
        "tool_call_id of 250,000 chars": _dump({**_event(), "tool_call_id": "c" * 250_000}),
        "unknown key: 120,000 ints": _dump({**_event(), "extra": [0] * 120_000}),
        "arguments: 120,000 ints": _dump(_event(arguments={"memory_content": "x", "x": [0] * 120_000})),
        # review section 1: values orjson refuses inside arguments
        f"arguments nested {deep} deep": _with_raw_arguments(b"[" * deep + b"]" * deep),
        "arguments nested 130,800 deep (the body limit)": _with_raw_arguments(
            b"[" * 130_800 + b"]" * 130_800
        ),
        "arguments 1,100 deep then 85,000 [] pairs": _with_raw_arguments(
            _fill(b"[" * 1100, b"[],", b"0" + b"]" * 1100, MAX_BODY_BYTES - 500)
        ),
        "arguments 1,100 deep then 60,000 strings": _with_raw_arguments(
            _fill(b"[" * 1100, b'"[",', b"0" + b"]" * 1100, MAX_BODY_BYTES - 500)
        ),
        "memory_content \\ud800 in a 256 KiB body": _with_raw_arguments(
            b'{"memory_content":"\\ud800","memory_scope":"server_wide","pad":"'
            + b"a" * (MAX_BODY_BYTES - 600)
            + b'"}'
        ),
        "memory_content 1e400": _with_raw_arguments(b'{"memory_content":1e400,"memory_scope":"server_wide"}'),
        "deep arguments holding 20,000 envelope keys": _with_raw_arguments(
            _fill(b"[" * 1100, b',"event_id":1', b"]" * 1100, MAX_BODY_BYTES - 500)
            .replace(b"[,", b"[{", 1)
            .replace(b"]", b"}]", 1)
        ),
        "200 KB unknown key, then deep arguments": b'{"pad":"'
        + b"p" * 200_000
        + b'",'
        + _with_raw_arguments(b"[" * 20_000 + b"]" * 20_000)[1:],
        "1000 members, \\ud800 in memory_content": _dump(
            _event(
                arguments={"memory_content": "@@", "memory_scope": "server_wide"},
                guild_members=_members(1000, 24),
            )
        ).replace(b'"@@"', b'"\\ud800"'),
        # the heaviest bodies the contract accepts
        "1000 guild members, 32-char names": _dump(_event(guild_members=_members(1000, 32))),
        "participants at their bounds": _dump(_event(participants=_participants(100, 32, 40))),
    }
    return found


def _reader() -> Callable[[bytes], object]:
    return read_event


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.envelope", description=__doc__)
    parser.add_argument("--runs", type=int, default=15, help="reads per body (default 15)")
    args = parser.parse_args(argv)
    read = _reader()
    print(f"{'body':<50} {'bytes':>7} {'median ms':>10} {'max ms':>8}  reads as")
    for name, body in bodies().items():
        times = []
        verdict: object = None
        for _ in range(args.runs):
            started = time.perf_counter()
            verdict = read(body)
            times.append((time.perf_counter() - started) * 1000)
        if isinstance(verdict, Unreadable):
            said = f"{verdict.kind}{' +ids' if verdict.ids else ''}: {verdict.error[:70]}"
        else:
            said = type(verdict).__name__
        print(f"{name:<50} {len(body):>7} {statistics.median(times):>10.2f} {max(times):>8.2f}  {said}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
