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
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import orjson
from aio_pika.abc import AbstractIncomingMessage

from bench.flood import percentile
from bench.sandbox import Sandbox
from sim.process import CHECKOUT, ModuleProcess
from sim.shard import EVENT_TYPE, ShardLink
from worker.broker.topology import shard_queue_name
from worker.config import Topology, env_of
from worker.store.migrate import apply_migrations
from worker.testing.workers import free_port

TOPOLOGY = Topology()
SHARDS_REPORT_AFTER = 3.0
BOT = "1150000000000000999"
AUTHOR = "1150000000000000200"
#: shard ids of the flood (A) and the trickle (B), and each one's guild
SHARD_A, SHARD_B = 0, 1
GUILDS = {SHARD_A: "1150000000000000001", SHARD_B: "1150000000000000002"}


@dataclass
class Answers:
    """Every result, by event id: when it came and how many copies."""

    arrived: dict[str, float] = field(default_factory=dict)
    copies: Counter[str] = field(default_factory=Counter)
    more: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_result(self, message: AbstractIncomingMessage) -> None:
        event_id = orjson.loads(message.body)["event_id"]
        self.arrived.setdefault(event_id, time.monotonic())
        self.copies[event_id] += 1
        self.more.set()

    async def on_notice(self, message: AbstractIncomingMessage) -> None:
        return None

    async def wait(self, ids: list[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while any(i not in self.arrived for i in ids):
            self.more.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self.more.wait(), left)
            except TimeoutError:
                return False
        return True


@dataclass
class Seeded:
    personas: dict[int, int]


async def seed(dsn: str) -> Seeded:
    """A server and a persona per shard's guild, and the author's users row."""
    conn = await asyncpg.connect(dsn)
    try:
        personas = {}
        for shard, guild in GUILDS.items():
            server_id = await conn.fetchval(
                "INSERT INTO servers (server_disc_id) VALUES ($1) RETURNING server_id", guild
            )
            personas[shard] = await conn.fetchval(
                "INSERT INTO personas (server_id, persona_nickname) VALUES ($1, 'Tomori')"
                " RETURNING persona_id",
                server_id,
            )
        await conn.execute("INSERT INTO users (user_disc_id) VALUES ($1)", AUTHOR)
        return Seeded(personas)
    finally:
        await conn.close()


def event(shard_id: int, guild_of: int, persona_id: int, n: int) -> tuple[str, bytes]:
    event_id = str(uuid.uuid4())
    body = {
        "schema_version": 1,
        "event_id": event_id,
        "tool_call_id": f"call_{n}",
        "tool_name": "create_long_term_memory",
        "issued_at": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "shard_id": shard_id,
        "arguments": {"memory_content": f"{{user}} knows fact number {n}", "memory_scope": "server_wide"},
        "context": {
            "guild_disc_id": GUILDS[guild_of],
            "channel_disc_id": "1150000000000000100",
            "thread_id": None,
            "triggering_user_disc_id": AUTHOR,
            "bot_user_disc_id": BOT,
            "persona_id": persona_id,
            "reply_via": None,
            "participants": [],
            "guild_members": [],
        },
    }
    return event_id, orjson.dumps(body)


class Shard:
    """One shard publishing on its own connection."""

    def __init__(self, link: ShardLink, kit_path: bool) -> None:
        self.link = link
        self.kit_path = kit_path
        self.sent: dict[str, float] = {}

    async def send(self, event_id: str, body: bytes) -> None:
        key = "tool.create_long_term_memory"
        if self.kit_path:
            key += f".shard.{self.link.shard_id}"
        self.sent[event_id] = time.monotonic()
        await self.link.publish(body, routing_key=key, message_id=event_id, type=EVENT_TYPE, mandatory=True)


async def trickle(shard: Shard, make: Any, rate: float, until: asyncio.Event, at_least: float) -> list[str]:
    """``rate`` events a second (on schedule, open loop) until ``until`` is set and ``at_least`` seconds
    passed."""
    ids: list[str] = []
    sending: set[asyncio.Future[None]] = set()
    started = time.monotonic()
    n = 0
    while not (until.is_set() and time.monotonic() - started >= at_least):
        event_id, body = make(n)
        ids.append(event_id)
        send = asyncio.ensure_future(shard.send(event_id, body))
        sending.add(send)
        send.add_done_callback(sending.discard)
        n += 1
        await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))
    await asyncio.gather(*sending)
    return ids


def latency_line(name: str, shard: Shard, answers: Answers, ids: list[str]) -> str:
    waits = [(answers.arrived[i] - shard.sent[i]) * 1000 for i in ids if i in answers.arrived]
    if not waits:
        return f"{name}: no answers"
    return (
        f"{name}: {len(waits)}/{len(ids)} answered, ms p50 {statistics.median(waits):.0f} "
        f"p99 {percentile(waits, 0.99):.0f} max {max(waits):.0f}"
    )


def processing_line(name: str, log_path: Path, ids: list[str]) -> str:
    """The worker's own time for ``ids`` (its "event processed" lines' ``duration_ms``: from the start of
    processing to the ack): what is left of the latency is the broker, the wait for a slot and the shard."""
    wanted = set(ids)
    took = []
    for raw in log_path.read_text(errors="replace").splitlines():
        if '"event processed"' not in raw:
            continue
        line = orjson.loads(raw)
        if line.get("event_id") in wanted:
            took.append(float(line["duration_ms"]))
    if not took:
        return f"{name}: no lines"
    p50, p99 = statistics.median(took), percentile(took, 0.99)
    return f"{name}: ms p50 {p50:.0f} p99 {p99:.0f} max {max(took):.0f}"


async def queue_depths(url: str, queues: list[str]) -> dict[str, int]:
    connection = await aio_pika.connect(url)
    depths = {}
    try:
        for name in queues:
            channel = await connection.channel()
            try:
                queue = await channel.declare_queue(name, passive=True)
                depths[name] = queue.declaration_result.message_count or 0
            except aio_pika.exceptions.ChannelClosed:
                continue  # not declared: nothing in it
            finally:
                if not channel.is_closed:
                    await channel.close()
    finally:
        await connection.close()
    return depths


async def run(args: argparse.Namespace) -> int:
    sandbox = Sandbox(args.postgres_dsn)
    workdir = Path(tempfile.mkdtemp(prefix="ltm-noisy-"))
    redis_port = free_port()
    redis = await asyncio.create_subprocess_exec(
        *(
            "redis-server",
            "--port",
            str(redis_port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ),
        cwd=workdir,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    worker: ModuleProcess | None = None
    links: list[ShardLink] = []
    try:
        dsn = await sandbox.new_database("_noisy")
        url = await sandbox.new_vhost(args.rabbitmq_url)
        await apply_migrations(dsn)
        seeded = await seed(dsn)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LTM_", "MAX_"))}
        env.update(env_of(postgres_dsn=dsn, rabbitmq_url=url, redis_url=f"redis://127.0.0.1:{redis_port}/0"))
        http_port = free_port()
        env.update(
            {"MAX_SERVER_MEMORIES": "100000000", "PYTHONUNBUFFERED": "1", "LTM_HTTP_PORT": str(http_port)}
        )
        if args.shards_report:
            env["LTM_METRICS_INTERVAL_SECONDS"] = "1"  # the activity rows `worker shards` adds up
        for setting in args.set or []:
            name, _, value = setting.partition("=")
            env[name] = value
        checkout: Path = args.checkout or CHECKOUT
        worker = ModuleProcess(
            "worker", ["run", "--log-format", "json"], env, workdir / "worker.log", "worker", cwd=checkout
        )
        worker.start()
        answers = Answers()
        shards = {}
        for shard_id in (SHARD_A, SHARD_B):
            link = ShardLink(url, shard_id, robust=False)
            await link.open(answers.on_result, answers.on_notice, no_ack=True, declare_exchanges=True)
            links.append(link)
            shards[shard_id] = Shard(link, args.path == "kit")
        await worker.wait_for_log("consuming", timeout=120)
        flooder, trickler = shards[SHARD_A], shards[SHARD_B]
        b_shard = SHARD_A if args.same_shard else SHARD_B
        if args.same_shard:
            trickler = Shard(links[0], args.path == "kit")

        def b_event(n: int) -> tuple[str, bytes]:
            return event(b_shard, SHARD_B, seeded.personas[SHARD_B], 1_000_000 + n)

        # warm-up: one event per shard on the version-1 key, so each has its own queue before the kit path
        warm = []
        for shard_id in (SHARD_A, SHARD_B):
            event_id, body = event(shard_id, shard_id, seeded.personas[shard_id], -1 - shard_id)
            await shards[shard_id].link.publish(body, message_id=event_id, type=EVENT_TYPE, mandatory=True)
            warm.append(event_id)
        await answers.wait(warm, 60)
        await asyncio.sleep(1.0)  # the shard queues are declared beside the first events

        print(
            f"worker of {checkout}; path {args.path}; B {'in' if args.same_shard else 'beside'} shard A; "
            f"B at {args.rate:g}/s; A floods {args.flood}; settings {' '.join(args.set or []) or 'defaults'}",
            flush=True,
        )
        done = asyncio.Event()
        done.set()
        quiet_ids = await trickle(trickler, b_event, args.rate, done, args.quiet_seconds)
        await answers.wait(quiet_ids, 60)
        print(latency_line("B quiet          ", trickler, answers, quiet_ids), flush=True)
        print(processing_line("  of which in process", workdir / "worker.log", quiet_ids), flush=True)

        drained = asyncio.Event()
        a_ids: list[str] = []
        started = time.monotonic()

        async def flood() -> float:
            pending: set[asyncio.Future[None]] = set()
            for n in range(args.flood):
                event_id, body = event(SHARD_A, SHARD_A, seeded.personas[SHARD_A], n)
                a_ids.append(event_id)
                pending.add(asyncio.ensure_future(flooder.send(event_id, body)))
                if len(pending) >= args.window:
                    _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            await asyncio.gather(*pending)
            published = time.monotonic() - started
            await answers.wait(a_ids, args.timeout)
            drained.set()
            return published

        flooding = asyncio.ensure_future(flood())
        reporting = asyncio.ensure_future(_shards_report(env, checkout)) if args.shards_report else None
        b_ids = await trickle(trickler, b_event, args.rate, drained, 0)
        published = await flooding
        if reporting is not None:
            print(await reporting, flush=True)
        await answers.wait(b_ids, 60)
        a_done = [answers.arrived[i] for i in a_ids if i in answers.arrived]
        print(latency_line("B beside A's flood", trickler, answers, b_ids), flush=True)
        print(processing_line("  of which in process", workdir / "worker.log", b_ids), flush=True)
        print(
            f"A's flood: {len(a_done)}/{len(a_ids)} answered; published in {published:.2f} s, drained "
            f"{(max(a_done) - started) if a_done else float('nan'):.2f} s after its first publish",
            flush=True,
        )
        moved = await _moved(http_port)
        if moved is not None:
            print(f"events the worker moved to their shard's own queue: {moved}", flush=True)
        every = [*warm, *quiet_ids, *a_ids, *b_ids]
        missing = [i for i in every if i not in answers.arrived]
        doubled = [i for i in every if answers.copies[i] > 1]
        await asyncio.sleep(2.0)
        queues = [
            TOPOLOGY.work_queue,
            TOPOLOGY.dead_letter_queue,
            *(shard_queue_name(TOPOLOGY, s) for s in (SHARD_A, SHARD_B)),
        ]
        left = {name: n for name, n in (await queue_depths(url, queues)).items() if n}
        rows = await _ledger_rows(dsn)
        print(
            f"exactly once: {len(every)} events, {len(missing)} unanswered, {len(doubled)} answered twice, "
            f"{rows} ledger rows; queues left non-empty: {left or 'none'}",
            flush=True,
        )
        worker.check_alive()
        return 0 if not missing and not left and rows == len(every) else 1
    finally:
        for link in links:
            await link.close(delete_queues=True)
        if worker is not None:
            worker.kill()
        redis.kill()
        await redis.wait()
        for problem in await sandbox.close():
            print(problem, file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)


async def _shards_report(env: dict[str, str], checkout: Path) -> str:
    """What ``worker shards --minutes 5`` prints 3 s into the flood (the worker's own settings)."""
    await asyncio.sleep(SHARDS_REPORT_AFTER)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "worker", "shards", "--minutes", "5",
        cwd=checkout, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    heading = f"$ worker shards --minutes 5   ({SHARDS_REPORT_AFTER:g} s into the flood)"
    return f"{heading}\n{out.decode().rstrip()}"


async def _moved(port: int) -> int | None:
    """``ltm_shard_events_moved_total`` summed over shards, from the worker's /metrics (None: none)."""

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            return str(response.read().decode())

    try:
        text = await asyncio.to_thread(scrape)
    except OSError:
        return None
    lines = [line for line in text.splitlines() if line.startswith("ltm_shard_events_moved_total{")]
    return (
        sum(int(float(line.rsplit(" ", 1)[1])) for line in lines)
        if "ltm_shard_events_moved" in text
        else None
    )


async def _ledger_rows(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM ltm_processed_events"))
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench noisy", description=__doc__)
    parser.add_argument("--flood", type=int, default=5000, help="events shard A floods (5000)")
    parser.add_argument("--rate", type=float, default=10.0, help="shard B's events per second (10)")
    parser.add_argument("--quiet-seconds", type=float, default=10.0, help="the quiet round's length (10)")
    parser.add_argument("--window", type=int, default=1000, help="A's publishes awaiting a confirm (1000)")
    parser.add_argument("--path", choices=("v1", "kit"), default="v1", help="how the shards publish (v1)")
    parser.add_argument("--same-shard", action="store_true", help="B's trickle as shard A, in B's guild")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up on the flood after (300 s)")
    parser.add_argument("--set", action="append", metavar="LTM_X=V", help="a worker setting (repeatable)")
    parser.add_argument(
        "--shards-report",
        action="store_true",
        help="print `worker shards` 3 s into the flood (the worker records its activity every second)",
    )
    parser.add_argument("--checkout", help="run the worker of another checkout (side-by-side comparisons)")
    parser.add_argument("--postgres-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/")
    args = parser.parse_args(argv)
    args.checkout = Path(args.checkout).resolve() if args.checkout else None
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
