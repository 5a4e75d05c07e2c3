"""``python -m bench shard-queues``: what each shard's own queue costs the broker (docs/fair-shares.md).

For each count of shards (``--shards 64 1024``), in a vhost of its own on the broker of ``--rabbitmq-url``
(a local one: its memory is read with ``rabbitmq-diagnostics``): declare the worker's topology and one queue
per shard exactly as a worker does (``ltm.create_memory.shard.<N>``, quorum, bound with the shard's two keys),
consume each as one worker does (one channel, prefetch ``LTM_SHARD_PREFETCH``), wait for the broker to
settle, and print the queues, the time to declare and to consume them, and the broker's memory before and
after (its total, and the quorum queues' share: ``quorum_queue_procs`` + ``quorum_ets``). The vhost is
deleted at the end. Other clients of a shared broker move its total: run it on a quiet broker and compare
the lines of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import time

import aio_pika

from bench.sandbox import Sandbox
from worker.broker.topology import declare_shard_queue, declare_topology, shard_queue_name
from worker.config import Settings, Topology
from worker.service.policy import RetryPolicy

TOPOLOGY = Topology()
SETTLE_SECONDS = 5.0


async def memory() -> dict[str, int]:
    """The local broker's memory by category (bytes), from ``rabbitmq-diagnostics memory_breakdown``."""
    process = await asyncio.create_subprocess_exec(
        "rabbitmq-diagnostics",
        "-q",
        "memory_breakdown",
        "--formatter",
        "json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    data = json.loads(out)
    return {key: int(value["bytes"]) for key, value in data.items() if isinstance(value, dict)}


def quorum_bytes(mem: dict[str, int]) -> int:
    return mem.get("quorum_queue_procs", 0) + mem.get("quorum_ets", 0)


async def settled() -> dict[str, int]:
    await asyncio.sleep(SETTLE_SECONDS)
    return await memory()


async def one(count: int, base_url: str, admin_dsn: str, prefetch: int) -> str:
    sandbox = Sandbox(admin_dsn)
    try:
        url = await sandbox.new_vhost(base_url)
        before = await settled()
        connection = await aio_pika.connect(url)
        try:
            channel = await connection.channel()
            await declare_topology(channel, TOPOLOGY, RetryPolicy.of(Settings()).tiers())
            started = time.monotonic()
            for shard_id in range(count):
                await declare_shard_queue(channel, TOPOLOGY, shard_id)
            declared = time.monotonic() - started
            consume = await connection.channel()
            await consume.set_qos(prefetch_count=prefetch)

            async def ignore(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                return None

            started = time.monotonic()
            for shard_id in range(count):
                queue = await consume.get_queue(shard_queue_name(TOPOLOGY, shard_id), ensure=False)
                await queue.consume(ignore)
            consumed = time.monotonic() - started
            after = await settled()
        finally:
            await connection.close()
    finally:
        for problem in await sandbox.close():
            print(problem, file=sys.stderr)
    total = (sum(after.values()) - sum(before.values())) / 2**20
    quorum = (quorum_bytes(after) - quorum_bytes(before)) / 2**20
    return (
        f"{count:>6} shards: {count + 6:>5} queues ({count} of them the shards'); "
        f"declared in {declared:.1f} s, consumed in {consumed:.1f} s; broker memory +{total:.0f} MiB in all "
        f"({total * 1024 / count:.0f} KiB a shard), quorum queues +{quorum:.0f} MiB "
        f"({quorum * 1024 / count:.0f} KiB a shard)"
    )


async def run(args: argparse.Namespace) -> int:
    if shutil.which("rabbitmq-diagnostics") is None:
        print("rabbitmq-diagnostics is not installed: the broker's memory cannot be read", file=sys.stderr)
        return 2
    print(f"broker memory now: {sum((await memory()).values()) / 2**20:.0f} MiB", flush=True)
    for count in args.shards:
        print(await one(count, args.rabbitmq_url, args.postgres_dsn, args.prefetch), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench shard-queues", description=__doc__)
    parser.add_argument("--shards", type=int, nargs="+", default=[64, 1024], help="shard counts (64 1024)")
    parser.add_argument("--prefetch", type=int, default=Settings().shard_prefetch, help="per-queue prefetch")
    parser.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--postgres-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
