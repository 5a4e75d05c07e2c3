"""``python -m bench noisy``: one shard's flood beside another shard's trickle (docs/fair-shares.md).

A worker process of this checkout (or of ``--checkout``, to compare side by side), in a database and vhost of
its own (:class:`bench.sandbox.Sandbox`, removed after) with a private Redis. Two shards, each on a
connection of its own, each in a guild of its own:

1. **quiet**: shard B sends ``--rate`` events a second for ``--quiet-seconds``; nothing else runs;
2. **flood**: shard A publishes ``--flood`` events as fast as the broker confirms them (``--window`` in
   flight), while B keeps its rate until every event of A is answered.

Every event is a real server-wide save (the memory limit is raised so none is refused). Printed per round:
B's publish-to-result latency (p50, p99, max), and for the flood A's publish time and drain time (first
publish to last result); then whether every event of both was answered exactly once and every queue ended
empty. ``--path kit`` publishes as the kit does (per-shard routing key ``tool.<name>.shard.<N>``, after one
event on the version-1 key has given each shard its queue); ``--same-shard`` sends B's trickle as shard A in
B's guild: how far one guild is kept from another guild of the same shard; ``--shards-report`` prints what
``worker shards`` shows 3 s into the flood. Nothing is asserted: the figures
are for the README and the closing note.

Besides B's latency over the whole flood, the line "of which sent in the flood's first second" is B's
latency over the events B published within 1 s of the flood's start (what a flood already in the common queue
costs a shard before the workers have sorted it); "to the broker's confirm" is the part of it from the publish
to the broker's confirm (under ``--same-shard`` B publishes on A's connection and channel, behind A's
``--window`` publishes in flight, as one shard's guilds share its connection), then from the confirm to the
result (the broker's delivery and the workers', each event's own). More tenants and workers:

- ``--loud K``: K flooding tenants, shards 0..K-1, each in a guild of its own and each publishing ``--flood``
  events at once with its own ``--window``; B is shard K (with ``--same-shard``: another guild of shard 0,
  so ``--same-shard --loud 2`` is a loud guild in each of two shards beside a quiet guild of the first).
  Each loud tenant's drain time is printed;
- ``--workers N``: N worker processes (each its own HTTP port and log), all consuming before anything is
  published; the moved count is summed over them. ``--kill-after S`` SIGKILLs the last one S seconds into
  the flood, the others go on (the broker redelivers its deliveries, the ledger answers them: every event
  must still be written once);
- ``--declare``: ``worker shards --declare`` every shard used, after the workers consume and before the
  warm-up (with ``--path kit`` the warm-up then goes on the shards' own keys: their queues exist from the
  start, as a deployment that declares ahead has them);
- ``--logs DIR``: keep the workers' logs in DIR and print, per worker, its warnings and errors by message and
  how many events it answered from the ledger, then the broker's redeliveries per queue (management API).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path

from bench.noisy_cast import AUTHOR, BOT, GUILD_A, GUILD_B, Answers, event, seed
from bench.noisy_report import queue_depths, worker_log_lines
from bench.noisy_run import run

__all__ = [
    "AUTHOR",
    "BOT",
    "GUILD_A",
    "GUILD_B",
    "Answers",
    "event",
    "main",
    "queue_depths",
    "run",
    "seed",
    "worker_log_lines",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench noisy", description=__doc__)
    parser.add_argument("--flood", type=int, default=5000, help="events shard A floods (5000)")
    parser.add_argument("--rate", type=float, default=10.0, help="shard B's events per second (10)")
    parser.add_argument("--quiet-seconds", type=float, default=10.0, help="the quiet round's length (10)")
    parser.add_argument("--window", type=int, default=1000, help="A's publishes awaiting a confirm (1000)")
    parser.add_argument("--path", choices=("v1", "kit"), default="v1", help="how the shards publish (v1)")
    parser.add_argument(
        "--unanswered",
        type=int,
        default=0,
        metavar="N",
        help="each loud tenant keeps at most N events waiting for their results, as the kits' per-guild cap "
        "(guild_in_flight_max, 64) holds a guild; the kit refuses the rest at once, the bench waits instead, "
        "so every event is still answered (0: no cap)",
    )
    parser.add_argument("--same-shard", action="store_true", help="B's trickle as shard A, in B's guild")
    parser.add_argument(
        "--own-channel",
        action="store_true",
        help="with --same-shard: B publishes on a connection of its own (as shard A), not behind A's",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="give up on the flood after (300 s)")
    parser.add_argument("--set", action="append", metavar="LTM_X=V", help="a worker setting (repeatable)")
    parser.add_argument(
        "--shards-report",
        action="store_true",
        help="print `worker shards` 3 s into the flood (the worker records its activity every second)",
    )
    parser.add_argument("--checkout", help="run the worker of another checkout (side-by-side comparisons)")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (1)")
    parser.add_argument(
        "--kill-after",
        type=float,
        metavar="SECONDS",
        help="SIGKILL the last worker this many seconds into the flood (off; needs --workers 2 or more)",
    )
    parser.add_argument(
        "--loud",
        type=int,
        default=1,
        help="flooding tenants, shards 0..K-1 each from one guild, each publishing --flood (1); B is shard "
        "K, or with --same-shard another guild of shard 0",
    )
    parser.add_argument(
        "--declare",
        action="store_true",
        help="`worker shards --declare` every shard used before the warm-up (with --path kit the warm-up "
        "then goes on the shards' own keys)",
    )
    parser.add_argument(
        "--logs",
        type=Path,
        metavar="DIR",
        help="keep the workers' logs in DIR; print their warnings and errors and the broker's redeliveries",
    )
    parser.add_argument("--postgres-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/")
    args = parser.parse_args(argv)
    args.checkout = Path(args.checkout).resolve() if args.checkout else None
    if args.workers < 1 or args.loud < 1:
        parser.error("--workers and --loud take 1 or more")
    if args.kill_after is not None and (args.workers < 2 or args.kill_after < 0):
        parser.error("--kill-after needs --workers 2 or more (someone must go on) and SECONDS of 0 or more")
    if args.declare and args.checkout is not None and not _declares(args.checkout):
        parser.error(f"--declare: `worker shards --help` of {args.checkout} has no --declare")
    return asyncio.run(run(args))


def _declares(checkout: Path) -> bool:
    """Whether the checkout's ``worker shards`` takes ``--declare``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LTM_", "MAX_"))}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "worker", "shards", "--help"],
            cwd=checkout, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--declare" in done.stdout


if __name__ == "__main__":
    sys.exit(main())
