"""``python -m bench.flood``: good events' latency while one worker reads a flood of the worst bodies.

security-review-3 section 3: 60 schema-invalid events of 240 KB each (``participants: [0]*120000``, ids
readable), published at once, held the worker's event loop about 0.33 s each; good events published every
50 ms meanwhile waited 9.3 s at the median. This program repeats that against a worker process of this
checkout: its own database and vhost (:class:`bench.sandbox.Sandbox`, dropped after), a private Redis on a
free port (the shared one's pub/sub channel is every test's), one seeded server. It runs a control round (good
events only) and a flood round (the same good events while the bad bodies arrive), and prints, per round, the
good events' publish-to-result latency (p50, p99, max), how many were answered, and how long the bad bodies
took to be dead-lettered and answered. Nothing is asserted: the figures are for the closing note.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import orjson
from aio_pika.abc import AbstractIncomingMessage

from bench.sandbox import PrivateRedis, Sandbox, env_for_worker
from sim.process import ModuleProcess
from sim.shard import EVENT_TYPE, ShardLink
from worker.store.migrate import apply_migrations
from worker.testing.seed import BotRows

GUILD, CHANNEL, TRIGGER, BOT = (
    "1150000000000000001",
    "1150000000000000100",
    "1150000000000000200",
    "1150000000000000999",
)
SHARD = 3


def event(persona_id: int, arguments: Any, **context: Any) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "event_id": str(uuid.uuid4()),
        "tool_call_id": f"call_{uuid.uuid4().hex[:8]}",
        "tool_name": "create_long_term_memory",
        "issued_at": "2026-12-02T08:00:00Z",
        "shard_id": SHARD,
        "arguments": arguments,
        "context": {
            "guild_disc_id": GUILD,
            "channel_disc_id": CHANNEL,
            "triggering_user_disc_id": TRIGGER,
            "bot_user_disc_id": BOT,
            "persona_id": persona_id,
            "participants": [],
            "guild_members": [],
            **context,
        },
    }


async def seed(dsn: str) -> int:
    """One server with one persona and the triggering user; the persona's id."""
    conn = await asyncpg.connect(dsn)
    try:
        return (await BotRows(conn).world(GUILD, TRIGGER)).persona_id
    finally:
        await conn.close()


class Results:
    """Arrival times of results by event id."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.status: dict[str, str] = {}
        self._more = asyncio.Event()

    def collector(self) -> Callable[[AbstractIncomingMessage], Awaitable[None]]:
        async def collect(message: AbstractIncomingMessage) -> None:
            body = orjson.loads(message.body)
            self.arrived.setdefault(body["event_id"], time.monotonic())
            self.status.setdefault(body.get("event_id"), body.get("status", "notice"))
            self._more.set()

        return collect

    async def wait(self, ids: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while any(i not in self.arrived for i in ids):
            self._more.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                await asyncio.wait_for(self._more.wait(), left)
            except TimeoutError:
                return


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def one_round(
    link: ShardLink,
    results: Results,
    persona_id: int,
    *,
    bad: list[bytes],
    seconds: float,
    interval: float,
) -> str:
    good_sent: dict[str, float] = {}
    bad_ids = [orjson.loads(body)["event_id"] for body in bad]
    started = time.monotonic()

    async def flood() -> None:
        await asyncio.gather(
            *(link.publish(body, message_id=i, type=EVENT_TYPE) for body, i in zip(bad, bad_ids, strict=True))
        )

    flooding = asyncio.create_task(flood())
    while time.monotonic() - started < seconds:
        good = event(persona_id, {"memory_content": "likes tea", "memory_scope": "server_wide"})
        good_sent[good["event_id"]] = time.monotonic()
        await link.publish(orjson.dumps(good), message_id=good["event_id"], type=EVENT_TYPE)
        await asyncio.sleep(interval)
    await flooding
    await results.wait([*good_sent, *bad_ids], timeout=120)
    latencies = [(results.arrived[i] - t) * 1000 for i, t in good_sent.items() if i in results.arrived]
    bad_done = [results.arrived[i] for i in bad_ids if i in results.arrived]
    line = (
        f"good events: {len(latencies)}/{len(good_sent)} answered, latency ms p50 "
        f"{statistics.median(latencies):.0f} p99 {percentile(latencies, 0.99):.0f} max {max(latencies):.0f}"
    )
    if bad:
        line += (
            f"; bad bodies: {len(bad_done)}/{len(bad)} answered "
            f"({', '.join(sorted({results.status[i] for i in bad_ids if i in results.status}))}), "
            f"the last {max(bad_done) - started:.2f} s after the flood began"
        )
    return line


async def main_async(args: argparse.Namespace) -> int:
    sandbox = Sandbox(args.postgres_dsn)
    workdir = Path(tempfile.mkdtemp(prefix="ltm-flood-"))
    redis = await PrivateRedis.start(workdir)
    worker: ModuleProcess | None = None
    link: ShardLink | None = None
    try:
        dsn = await sandbox.new_database("_flood")
        url = await sandbox.new_vhost(args.rabbitmq_url)
        await apply_migrations(dsn)
        persona_id = await seed(dsn)
        env = env_for_worker(postgres_dsn=dsn, rabbitmq_url=url, redis_url=redis.url)
        worker = ModuleProcess(
            "worker", ["run", "--log-format", "json"], env, workdir / "worker.log", "worker"
        )
        worker.start()
        results = Results()
        link = ShardLink(url, SHARD, robust=False)
        await link.open(results.collector(), results.collector(), no_ack=True, declare_exchanges=True)
        await worker.wait_for_log("consuming", timeout=60)
        arguments = {"memory_content": "x", "memory_scope": "server_wide"}
        poison = [
            orjson.dumps(event(persona_id, arguments, participants=[0] * 120_000)) for _ in range(args.bad)
        ]
        every = f"{args.interval * 1000:.0f} ms"
        print(f"worst body: {len(poison[0])} bytes, {args.bad} of them; good events every {every}")
        for name, bad in (("control", []), ("flood", poison)):
            line = await one_round(
                link, results, persona_id, bad=bad, seconds=args.seconds, interval=args.interval
            )
            print(f"{name}: {line}", flush=True)
        worker.check_alive()
        return 0
    finally:
        if link is not None:
            await link.close(delete_queues=True)
        if worker is not None:
            worker.kill()
        await redis.stop()
        for problem in await sandbox.close():
            print(problem, file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.flood", description=__doc__)
    parser.add_argument("--postgres-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--bad", type=int, default=60, help="bad bodies in the flood (default 60)")
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="how long good events are sent (default 5)"
    )
    parser.add_argument(
        "--interval", type=float, default=0.05, help="seconds between good events (default 0.05)"
    )
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
