"""``python -m bench.hostile``: what one hostile message does to a worker that is answering ordinary events.

For each case, on a fresh database and vhost: one ``worker run``, ordinary events at ``--rate`` per second for
``--seconds``, and the case's message(s) sent once, two seconds in. Printed per case: ordinary events answered
of those sent (within 10 s after the last was sent), their latency (p50, max), the worker's reconnects (its
"connection lost" log lines), its peak RSS, and whether ``worker dlq list`` works afterwards.

``--source DIR`` runs the worker (and its ``migrate`` and ``dlq``) from another checkout, e.g. a worktree of
an older commit, so the same traffic measures the code before and after a change side by side. Everything
runs on this machine's services (the bench's sandbox: its own database and vhost, removed after).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aio_pika
import aiormq

from bench.sandbox import Sandbox, env_for_worker
from bench.seed import Prefill, seed_database
from bench.workload import build_workload
from bench.world import World, build_world
from sim import amqp_raw as raw
from sim.process import CHECKOUT, ModuleProcess
from sim.shard import ShardLink
from worker.config import Limits

TOOL_CALLS, KEY = "tool.create_long_term_memory", "tool.create_long_term_memory"
EXCHANGE = "tomori.tool_calls"
FRAME_MAX = 131_072


@dataclass(frozen=True)
class Hostile:
    """One case: ``count`` messages of ``body`` with ``properties`` (None: ordinary JSON properties)."""

    body: bytes
    properties: raw.RawProperties | None
    count: int = 1


def _filled_properties() -> raw.RawProperties:
    def filled(size: int) -> raw.RawProperties:
        return raw.properties(headers=raw.entries([(b"filler", raw.longstr(b"f" * size))]))

    first = filled(130_000)
    return filled(130_000 + FRAME_MAX - 40 - (20 + len(first.marshal())))


def cases(template: bytes) -> dict[str, Callable[[], Hostile]]:
    """Security review 3, sections 1 to 3; ``template`` is one valid event body of the seeded world."""
    event = json.loads(template)

    def variant(**changes: object) -> bytes:
        return json.dumps({**event, **changes}).encode()

    def participants_flood() -> bytes:
        context = {**event["context"], "participants": [0] * 120_000}  # 240 KB: under the body limit
        return json.dumps({**event, "context": context}, separators=(",", ":")).encode()

    micro = int(time.time() * 1_000_000)
    return {
        "timestamp in microseconds": lambda: Hostile(template, raw.properties(timestamp_seconds=micro)),
        "T header out of range": lambda: Hostile(
            template, raw.properties(headers=raw.entries([(b"sent", raw.timestamp(2**64 - 1))]))
        ),
        "message_id not UTF-8": lambda: Hostile(template, raw.properties(message_id=b"\xff\xfe")),
        "table nested 5,000 deep": lambda: Hostile(template, raw.properties(headers=raw.deep_table(5_000))),
        "headers 40 B under frame_max, malformed body": lambda: Hostile(
            b"\xff not json", _filled_properties()
        ),
        "tool_call_id of 300 characters": lambda: Hostile(variant(tool_call_id="c" * 300), None),
        "24 bodies of 16 MiB": lambda: Hostile(b"[" + b" " * (16 * 2**20 - 2) + b"]", None, 24),
        "60 schema-invalid bodies of 240 KB": lambda: Hostile(participants_flood(), None, 60),
    }


@dataclass
class Outcome:
    sent: int
    answered: int
    latencies: list[float]
    reconnects: int
    peak_rss_mib: float
    dlq_list_exit: int

    def line(self, name: str) -> str:
        lat = sorted(self.latencies)
        p50 = statistics.median(lat) * 1000 if lat else float("nan")
        top = lat[-1] * 1000 if lat else float("nan")
        return (
            f"{name:<46} {self.answered:>4}/{self.sent:<4} p50 {p50:>8.1f} ms  max {top:>8.1f} ms  "
            f"reconnects {self.reconnects:>3}  peak RSS {self.peak_rss_mib:>6.0f} MiB  dlq list exit "
            f"{self.dlq_list_exit}"
        )


def _peak_rss_mib(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _world(limits: Limits) -> World:
    return build_world(
        seed=7, servers=30, personas_per_server=2, users=300, members_per_server=25, limits=limits
    )


async def _run(*command: str, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *command, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await asyncio.wait_for(process.communicate(), 120)
    return process.returncode or 0, output.decode(errors="replace")


async def run_case(
    name: str, make: Callable[[], Hostile], args: argparse.Namespace, log_dir: Path
) -> Outcome:
    limits = Limits()
    world = _world(limits)
    count = int(args.rate * args.seconds) + 1
    workload = build_workload(world, count=count, shards=1, seed=7, limits=limits)
    sandbox = Sandbox(args.postgres_dsn)
    worker: ModuleProcess | None = None
    try:
        dsn = await sandbox.new_database()
        url = await sandbox.new_vhost(args.rabbitmq_url)
        # the other settings at the defaults of the worker run (--source may be an older checkout)
        env = env_for_worker(postgres_dsn=dsn, rabbitmq_url=url, redis_url=args.redis_url, log_format="json")
        code, output = await _run(sys.executable, "-m", "worker", "migrate", cwd=args.source, env=env)
        if code != 0:
            raise RuntimeError(f"migrate failed: {output[-2000:]}")
        await seed_database(dsn, world, Prefill(workload.server_memories, workload.personal_memories))
        log_path = log_dir / f"{name.replace(' ', '-').replace('/', '-')}.log"
        worker = ModuleProcess("worker", ["run"], env, log_path, "worker", cwd=args.source).start()
        deadline = time.monotonic() + 60
        while "consuming" not in (log_path.read_text() if log_path.exists() else ""):
            worker.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError("the worker did not start consuming")
            await asyncio.sleep(0.1)

        sent_at: dict[str, float] = {}
        answered_at: dict[str, float] = {}

        published, all_answered = asyncio.Event(), asyncio.Event()

        async def on_result(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            event_id = json.loads(message.body)["event_id"]
            answered_at.setdefault(event_id, time.monotonic())
            if published.is_set() and len(answered_at.keys() & sent_at.keys()) == len(sent_at):
                all_answered.set()

        async def ignore(_: aio_pika.abc.AbstractIncomingMessage) -> None:
            return None

        shard = ShardLink(url, 0)
        await shard.open(on_result, ignore, no_ack=True)
        hostile = make()
        try:
            start = time.monotonic()
            injected = False
            for n, planned in enumerate(workload.events):
                due = start + n / args.rate
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                if not injected and time.monotonic() - start >= 2.0:
                    injected = True
                    asyncio.get_running_loop().create_task(_inject(url, hostile))
                sent_at[planned.event_id] = time.monotonic()
                await shard.publish(planned.body, routing_key=planned.routing_key)
            published.set()
            if len(answered_at.keys() & sent_at.keys()) < len(sent_at):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(all_answered.wait(), 10)
        finally:
            await shard.close(delete_queues=True)
        peak = _peak_rss_mib(worker.pid)
        listed, _ = await _run(sys.executable, "-m", "worker", "dlq", "list", cwd=args.source, env=env)
        reconnects = log_path.read_text(errors="replace").count("connection lost")
        latencies = [answered_at[e] - sent_at[e] for e in sent_at if e in answered_at]
        return Outcome(len(sent_at), len(latencies), latencies, reconnects, peak, listed)
    finally:
        if worker is not None:
            worker.kill()
        await sandbox.close()


async def _inject(url: str, hostile: Hostile) -> None:
    connection = await aiormq.connect(url)
    try:
        for _ in range(hostile.count):
            channel = await connection.channel()
            with contextlib.suppress(aiormq.exceptions.AMQPError):
                if hostile.properties is None:
                    await channel.basic_publish(hostile.body, exchange=EXCHANGE, routing_key=KEY)
                else:
                    await channel.basic_publish(
                        hostile.body, exchange=EXCHANGE, routing_key=KEY, properties=hostile.properties
                    )
    finally:
        with contextlib.suppress(Exception):
            await connection.close()


async def main(args: argparse.Namespace) -> None:
    limits = Limits()
    world = build_world(
        seed=7, servers=30, personas_per_server=2, users=300, members_per_server=25, limits=limits
    )
    template = build_workload(world, count=1, shards=1, seed=7, limits=limits).events[0].body
    chosen = cases(template)
    names = [n for n in chosen if not args.case or any(c.lower() in n.lower() for c in args.case)]
    log_dir = Path(tempfile.mkdtemp(prefix="ltm-hostile-"))
    print(
        f"worker from {args.source}; {args.rate:g} ordinary events/s, {args.seconds:g} s a case;",
        f"logs in {log_dir}",
    )
    for name in names:
        outcome = await run_case(name, chosen[name], args, log_dir)
        print(outcome.line(name), flush=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=CHECKOUT, help="checkout to run the worker from")
    parser.add_argument("--seconds", type=float, default=15.0, help="ordinary traffic per case (default 15)")
    parser.add_argument("--rate", type=float, default=20.0, help="ordinary events per second (default 20)")
    parser.add_argument("--case", action="append", help="only cases whose name contains this (repeatable)")
    parser.add_argument("--postgres-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
