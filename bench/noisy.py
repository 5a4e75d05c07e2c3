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
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import aio_pika
import asyncpg
import orjson
from aio_pika.abc import AbstractIncomingMessage

from bench.flood import percentile
from bench.sandbox import Sandbox, management_url_from_env
from sim.process import CHECKOUT, ModuleProcess
from sim.shard import EVENT_TYPE, TOOL_ROUTING_KEY, ShardLink
from worker.broker.topology import shard_queue_name
from worker.config import Topology, env_of
from worker.store.migrate import apply_migrations
from worker.testing.management import ManagementApi
from worker.testing.seed import BotRows
from worker.testing.workers import free_port

TOPOLOGY = Topology()
SHARDS_REPORT_AFTER = 3.0
BOT = "1150000000000000999"
AUTHOR = "1150000000000000200"
#: the guild of the first loud tenant (A, shard 0) and B's guild; the other loud tenants' guilds follow
GUILD_A, GUILD_B = "1150000000000000001", "1150000000000000002"
#: B's latency is also given over the events it sent this soon after the flood's start
FIRST_SECOND = 1.0
#: the management API's statistics lag this much (collect_statistics_interval is 5 s by default)
STATS_SECONDS = 6.0


def loud_guild(index: int) -> str:
    """The guild of loud tenant ``index`` (0 is A's, as before there were several)."""
    return GUILD_A if index == 0 else str(int(GUILD_A) + 10 + index)


@dataclass(frozen=True)
class Tenant:
    """Who publishes: a shard, from one guild of it."""

    shard_id: int
    guild: str


@dataclass(frozen=True)
class Cast:
    """The loud tenants, B, and every shard and guild used."""

    loud: list[Tenant]
    quiet: Tenant

    @classmethod
    def of(cls, loud: int, same_shard: bool) -> Cast:
        tenants = [Tenant(i, loud_guild(i)) for i in range(loud)]
        return cls(tenants, Tenant(0 if same_shard else loud, GUILD_B))

    @property
    def shards(self) -> list[int]:
        return sorted({t.shard_id for t in (*self.loud, self.quiet)})

    @property
    def guilds(self) -> list[str]:
        return [*(t.guild for t in self.loud), self.quiet.guild]

    def warm_guild(self, shard_id: int) -> str:
        """The guild a shard's warm-up event comes from (a loud one's own, else B's)."""
        return next((t.guild for t in self.loud if t.shard_id == shard_id), self.quiet.guild)


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
    #: by guild
    personas: dict[str, int]


async def seed(dsn: str, guilds: list[str]) -> Seeded:
    """A server and a persona per guild, and the author's users row."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = BotRows(conn)
        personas = {}
        for guild in guilds:
            personas[guild], _ = await rows.persona(await rows.server(guild))
        await rows.user(AUTHOR)
        return Seeded(personas)
    finally:
        await conn.close()


def event(shard_id: int, guild: str, persona_id: int, n: int) -> tuple[str, bytes]:
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
            "guild_disc_id": guild,
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
        self.confirmed: dict[str, float] = {}

    @property
    def key(self) -> str:
        key = "tool.create_long_term_memory"
        if self.kit_path:
            key += f".shard.{self.link.shard_id}"
        return key

    async def send(self, event_id: str, body: bytes) -> None:
        self.sent[event_id] = time.monotonic()
        await self.link.publish(
            body, routing_key=self.key, message_id=event_id, type=EVENT_TYPE, mandatory=True
        )
        self.confirmed[event_id] = time.monotonic()


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


def publishing_line(name: str, shard: Shard, answers: Answers, ids: list[str]) -> str:
    """The publish to the broker's confirm of ``ids``: what of the latency is the shard's own connection
    (under ``--same-shard`` B's events wait there behind A's publishes in flight) and the queue's write; then
    the confirm to the result, each event's own: the broker's delivery and the workers'."""
    ms = 1000

    def spread(waits: list[float]) -> str:
        p50, p99 = statistics.median(waits), percentile(waits, 0.99)
        return f"ms p50 {p50:.0f} p99 {p99:.0f} max {max(waits):.0f}"

    confirmed = [i for i in ids if i in shard.confirmed]
    if not confirmed:
        return f"{name}: none confirmed"
    line = f"{name}: {spread([(shard.confirmed[i] - shard.sent[i]) * ms for i in confirmed])}"
    after = [(answers.arrived[i] - shard.confirmed[i]) * ms for i in confirmed if i in answers.arrived]
    return f"{line}; from the confirm to the result: {spread(after)}" if after else line


def processing_line(name: str, log_paths: list[Path], ids: list[str]) -> str:
    """The workers' own time for ``ids`` (their "event processed" lines' ``duration_ms``: from the start of
    processing to the ack): what is left of the latency is the broker, the wait for a slot and the shard."""
    wanted = set(ids)
    took = []
    for log_path in log_paths:
        for raw in log_path.read_text(errors="replace").splitlines():
            if '"event processed"' not in raw:
                continue
            try:
                line = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue  # a line cut short by a SIGKILL
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
    cast = Cast.of(args.loud, args.same_shard)
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
    workers: list[ModuleProcess] = []
    killed: ModuleProcess | None = None
    links: list[ShardLink] = []
    try:
        dsn = await sandbox.new_database("_noisy")
        url = await sandbox.new_vhost(args.rabbitmq_url)
        await apply_migrations(dsn)
        seeded = await seed(dsn, cast.guilds)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LTM_", "MAX_"))}
        env.update(env_of(postgres_dsn=dsn, rabbitmq_url=url, redis_url=f"redis://127.0.0.1:{redis_port}/0"))
        env.update({"MAX_SERVER_MEMORIES": "100000000", "PYTHONUNBUFFERED": "1"})
        if args.shards_report:
            env["LTM_METRICS_INTERVAL_SECONDS"] = "1"  # the activity rows `worker shards` adds up
        for setting in args.set or []:
            name, _, value = setting.partition("=")
            env[name] = value
        checkout: Path = args.checkout or CHECKOUT
        http_ports = [free_port() for _ in range(args.workers)]
        log_paths = (
            [workdir / "worker.log"]
            if args.workers == 1
            else [workdir / f"worker-{i + 1}.log" for i in range(args.workers)]
        )
        for i, (port, log_path) in enumerate(zip(http_ports, log_paths, strict=True)):
            name = "worker" if args.workers == 1 else f"worker {i + 1}"
            worker_env = {**env, "LTM_HTTP_PORT": str(port)}
            worker = ModuleProcess(
                "worker", ["run", "--log-format", "json"], worker_env, log_path, name, cwd=checkout
            )
            workers.append(worker.start())
        env["LTM_HTTP_PORT"] = str(http_ports[0])  # `worker shards`: the first worker's settings
        answers = Answers()
        shards: dict[int, Shard] = {}
        for shard_id in cast.shards:
            link = ShardLink(url, shard_id, robust=False)
            await link.open(answers.on_result, answers.on_notice, no_ack=True, declare_exchanges=True)
            links.append(link)
            shards[shard_id] = Shard(link, args.path == "kit")
        for worker in workers:
            await worker.wait_for_log("consuming", timeout=120)
        if args.declare:
            print(await _declare(env, checkout, cast.shards), flush=True)
        flooders = [shards[t.shard_id] for t in cast.loud]
        b = cast.quiet
        trickler = shards[b.shard_id] if not args.same_shard else Shard(shards[0].link, args.path == "kit")
        if args.same_shard and args.own_channel:
            # B's publishes on a connection of their own, as shard 0's: they no longer wait behind A's on one
            # channel (what a shard whose guilds publish on channels of their own would see)
            own = ShardLink(url, 0, robust=False)
            await own.open(answers.on_result, answers.on_notice, no_ack=True, declare_exchanges=True)
            links.append(own)
            trickler = Shard(own, args.path == "kit")

        def b_event(n: int) -> tuple[str, bytes]:
            return event(b.shard_id, b.guild, seeded.personas[b.guild], 1_000_000 + n)

        # warm-up: one event per shard on the version-1 key, so each has its own queue before the kit path
        # (declared ahead, a shard on the kit publishes on its own key from the first)
        warm = []
        for shard_id in cast.shards:
            guild = cast.warm_guild(shard_id)
            event_id, body = event(shard_id, guild, seeded.personas[guild], -1 - shard_id)
            key = shards[shard_id].key if args.declare else TOOL_ROUTING_KEY
            await shards[shard_id].link.publish(
                body, routing_key=key, message_id=event_id, type=EVENT_TYPE, mandatory=True
            )
            warm.append(event_id)
        await answers.wait(warm, 60)
        await asyncio.sleep(1.0)  # the shard queues are declared beside the first events

        line = (
            f"worker of {checkout}; path {args.path}; B {'in' if args.same_shard else 'beside'} shard A; "
            f"B at {args.rate:g}/s; A floods {args.flood}; settings {' '.join(args.set or []) or 'defaults'}"
        )
        if args.workers != 1 or args.loud != 1 or args.kill_after is not None or args.declare:
            line += (
                f"; {args.workers} worker(s); {args.loud} loud tenant(s), shards "
                f"{', '.join(str(t.shard_id) for t in cast.loud)}, each flooding {args.flood} from one "
                f"guild; B is shard {b.shard_id}"
                + (
                    f"; the last worker killed {args.kill_after:g} s into the flood"
                    if args.kill_after is not None
                    else ""
                )
                + ("; shards declared ahead" if args.declare else "")
            )
        print(line, flush=True)
        done = asyncio.Event()
        done.set()
        quiet_ids = await trickle(trickler, b_event, args.rate, done, args.quiet_seconds)
        await answers.wait(quiet_ids, 60)
        print(latency_line("B quiet          ", trickler, answers, quiet_ids), flush=True)
        print(processing_line("  of which in process", log_paths, quiet_ids), flush=True)

        drained = asyncio.Event()
        loud_ids: list[list[str]] = [[] for _ in cast.loud]
        started = time.monotonic()

        async def flood(index: int) -> float:
            tenant, flooder, ids = cast.loud[index], flooders[index], loud_ids[index]
            persona = seeded.personas[tenant.guild]
            pending: set[asyncio.Future[None]] = set()
            unanswered: list[str] = []
            for n in range(args.flood):
                while args.unanswered and len(unanswered) >= args.unanswered:
                    answers.more.clear()
                    unanswered = [i for i in unanswered if i not in answers.arrived]
                    if len(unanswered) >= args.unanswered:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(answers.more.wait(), 1.0)
                event_id, body = event(tenant.shard_id, tenant.guild, persona, n)
                unanswered.append(event_id)
                ids.append(event_id)
                pending.add(asyncio.ensure_future(flooder.send(event_id, body)))
                if len(pending) >= args.window:
                    _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            await asyncio.gather(*pending)
            published = time.monotonic() - started
            await answers.wait(ids, args.timeout)
            return published

        async def floods() -> list[float]:
            try:
                return list(await asyncio.gather(*(flood(i) for i in range(len(cast.loud)))))
            finally:
                drained.set()

        async def kill_last(after: float) -> float:
            await asyncio.sleep(after)
            workers[-1].kill()
            return time.monotonic() - started

        flooding = asyncio.ensure_future(floods())
        killing = asyncio.ensure_future(kill_last(args.kill_after)) if args.kill_after is not None else None
        reporting = asyncio.ensure_future(_shards_report(env, checkout)) if args.shards_report else None
        b_ids = await trickle(trickler, b_event, args.rate, drained, 0)
        published = await flooding
        if killing is not None:
            if not killing.done():
                killing.cancel()
                print(
                    f"the last worker was not killed: the flood drained before {args.kill_after:g} s",
                    flush=True,
                )
            else:
                killed = workers[-1]
                print(
                    f"{killed.name} (pid {killed.pid}) SIGKILLed {killing.result():.2f} s into the flood",
                    flush=True,
                )
        if reporting is not None:
            print(await reporting, flush=True)
        await answers.wait(b_ids, 60)
        first_ids = [i for i in b_ids if trickler.sent[i] - started < FIRST_SECOND]
        beside = "B beside A's flood" if len(cast.loud) == 1 else "B beside the floods"
        print(latency_line(beside, trickler, answers, b_ids), flush=True)
        print(processing_line("  of which in process", log_paths, b_ids), flush=True)
        print(publishing_line("  of which to the broker's confirm", trickler, answers, b_ids), flush=True)
        print(
            latency_line("  of which sent in the flood's first second", trickler, answers, first_ids),
            flush=True,
        )
        print(
            publishing_line("    of those, to the broker's confirm", trickler, answers, first_ids), flush=True
        )
        for index, (tenant, ids) in enumerate(zip(cast.loud, loud_ids, strict=True)):
            done_at = [answers.arrived[i] for i in ids if i in answers.arrived]
            name = "A" if len(cast.loud) == 1 else f"A{index} (shard {tenant.shard_id}, guild {tenant.guild})"
            drain = (max(done_at) - started) if done_at else float("nan")
            print(
                f"{name}'s flood: {len(done_at)}/{len(ids)} answered; published in {published[index]:.2f} s, "
                f"drained {drain:.2f} s after its first publish",
                flush=True,
            )
        running = [(w, port) for w, port in zip(workers, http_ports, strict=True) if w is not killed]
        counts = [await _moved(port) for _, port in running]
        moved = [n for n in counts if n is not None]
        if moved and args.workers == 1:
            print(f"events the worker moved to their shard's own queue: {moved[0]}", flush=True)
        elif moved:
            print(
                f"events the workers moved to their shard's own queue: {sum(moved)} "
                f"(summed over the {len(moved)} worker(s) still running: {', '.join(map(str, moved))})",
                flush=True,
            )
        a_ids = [i for ids in loud_ids for i in ids]
        every = [*warm, *quiet_ids, *a_ids, *b_ids]
        missing = [i for i in every if i not in answers.arrived]
        doubled = [i for i in every if answers.copies[i] > 1]
        await asyncio.sleep(2.0)
        queues = [
            TOPOLOGY.work_queue,
            TOPOLOGY.dead_letter_queue,
            *(shard_queue_name(TOPOLOGY, s) for s in cast.shards),
        ]
        left = {name: n for name, n in (await queue_depths(url, queues)).items() if n}
        rows = await _ledger_rows(dsn)
        print(
            f"exactly once: {len(every)} events, {len(missing)} unanswered, {len(doubled)} answered twice, "
            f"{rows} ledger rows; queues left non-empty: {left or 'none'}",
            flush=True,
        )
        if args.logs is not None:
            for log_path in log_paths:
                print(_log_summary(log_path), flush=True)
            print(await _redeliveries(args.rabbitmq_url, sandbox.vhost, queues), flush=True)
        for worker in workers:
            if worker is not killed:
                worker.check_alive()
        return 0 if not missing and not left and rows == len(every) else 1
    finally:
        for link in links:
            await link.close(delete_queues=True)
        for worker in workers:
            worker.kill()
        redis.kill()
        await redis.wait()
        for problem in await sandbox.close():
            print(problem, file=sys.stderr)
        if args.logs is not None:
            _keep_logs(workdir, args.logs)
        shutil.rmtree(workdir, ignore_errors=True)


def _keep_logs(workdir: Path, keep: Path) -> None:
    keep.mkdir(parents=True, exist_ok=True)
    for log_path in workdir.glob("worker*.log"):
        shutil.copy(log_path, keep / log_path.name)


async def _declare(env: dict[str, str], checkout: Path, shard_ids: list[int]) -> str:
    """``worker shards --declare`` the shards (the workers' settings), what it printed; raise if it failed."""
    command = ["worker", "shards", "--declare", *map(str, shard_ids)]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", *command,
        cwd=checkout, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    text = f"$ {' '.join(command)}\n{out.decode().rstrip()}"
    if process.returncode != 0:
        raise RuntimeError(f"{text}\n(exit {process.returncode})")
    return text


def worker_log_lines(log_path: Path, notable: Counter[str]) -> Iterator[dict[str, Any]]:
    """The JSON lines of a worker's log; a line that is not JSON, and every warning or error (by its message),
    counted in ``notable``."""
    for raw in log_path.read_text(errors="replace").splitlines():
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError:
            if raw.strip():
                notable[f"(not JSON) {raw.strip()[:120]}"] += 1
            continue
        if not isinstance(line, dict):
            continue
        level = str(line.get("level", "")).lower()
        if level in ("warning", "error", "critical", "exception"):
            notable[f"{level}: {line.get('event', '')}"] += 1
        yield line


def _log_summary(log_path: Path) -> str:
    """One worker's log: events answered (of them from the ledger), its warnings and errors by message."""
    processed = replayed = 0
    notable: Counter[str] = Counter()
    for line in worker_log_lines(log_path, notable):
        if line.get("event") == "event processed":
            processed += 1
            replayed += bool(line.get("replayed"))
    listed = "; ".join(f"{n} x {m}" for m, n in notable.most_common()) or "none"
    return (
        f"{log_path.name}: {processed} events answered ({replayed} from the ledger); "
        f"warnings and errors: {listed}"
    )


async def _redeliveries(rabbitmq_url: str, vhost: str | None, queues: list[str]) -> str:
    """The broker's redeliveries per queue (``message_stats.redeliver``: handed back, or lost with a channel
    or a worker), from the management API once its statistics caught up."""
    if vhost is None:
        return "broker redeliveries: no vhost of the bench's own"
    parts = urlsplit(rabbitmq_url)
    base = management_url_from_env() or f"http://{parts.hostname or '127.0.0.1'}:15672"
    api = ManagementApi.from_url(base, unquote(parts.username or "guest"), unquote(parts.password or "guest"))
    await asyncio.sleep(STATS_SECONDS)
    found = {}
    try:
        for name in queues:
            state = await asyncio.to_thread(api.queue, vhost, name)
            stats = (state or {}).get("message_stats") or {}
            found[name] = int(stats.get("redeliver", 0) or 0)
    except Exception as exc:
        return f"broker redeliveries: the management API at {base} did not answer ({exc})"
    return "broker redeliveries: " + (", ".join(f"{q} {n}" for q, n in found.items() if n) or "none")


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
