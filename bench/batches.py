"""``python -m bench.batches``: what a batch of events costs Postgres and the worker's client.

The store alone, on one connection: the bench's world and event mix, a warmup of single events followed
by ``ANALYZE`` (as autovacuum would), then for each batch size the same number of events through
:func:`~worker.service.process.process_batch`, one batch after another. Prints, per batch size: events/s,
and CPU milliseconds per event of the Postgres backend (read from ``/proc``, so Postgres must run on this
machine) and of this process (the worker's side: asyncpg, the pipeline, the payloads). No RabbitMQ, no
Redis, no concurrency: the figures isolate what batching changes. Uses a fresh ``ltm_bench_<hex>``
database on the server of ``LTM_POSTGRES_DSN``, dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from bench.ceilings import parse_events
from bench.cpu import process_cpu_seconds
from bench.sandbox import Sandbox
from bench.seed import Prefill, analyze, seed_database
from bench.workload import build_workload
from bench.world import build_world
from worker.config import load_settings
from worker.service.process import process_batch
from worker.store.pool import create_pool

WARMUP = 1000


@dataclass(frozen=True, slots=True)
class BatchCost:
    size: int
    events: int
    seconds: float
    postgres_cpu: float | None  # seconds; None when the backend's /proc entry cannot be read
    client_cpu: float

    def row(self) -> str:
        pg = f"{1000 * self.postgres_cpu / self.events:8.3f}" if self.postgres_cpu is not None else "       -"
        return (
            f"{self.size:>5}  {self.events:>7,}  {self.events / self.seconds:>9,.0f}  {pg}"
            f"  {1000 * self.client_cpu / self.events:8.3f}"
        )


HEADER = "batch   events   events/s  pg ms/ev  client ms/ev"


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure(admin_dsn: str, sizes: Sequence[int], events: int, *, seed: int = 1) -> list[BatchCost]:
    """Run ``events`` events at each batch size in ``sizes`` (fresh events each time) on a fresh database."""
    limits = load_settings({}).limits
    # the statement cache as the worker would have it here (LTM_POSTGRES_STATEMENT_CACHE_SIZE)
    cache_size = load_settings().postgres_statement_cache_size
    world = build_world(
        seed=seed, servers=100, personas_per_server=2, users=2000, members_per_server=25, limits=limits
    )
    workload = build_workload(world, count=WARMUP + events * len(sizes), shards=8, seed=seed, limits=limits)
    parsed = [event for _, event in parse_events(workload.events)]
    sandbox = Sandbox(admin_dsn)
    try:
        dsn = await sandbox.new_database()
        await seed_database(dsn, world, Prefill(workload.server_memories, workload.personal_memories))
        pool = await create_pool(dsn, size=1, statement_cache_size=cache_size)
        try:
            async with pool.acquire() as conn:
                pid: int = await conn.fetchval("SELECT pg_backend_pid()")
            for event in parsed[:WARMUP]:
                await process_batch(pool, [(event, 1)], limits)
            await analyze(dsn)
            costs = []
            for k, size in enumerate(sizes):
                chunk = parsed[WARMUP + k * events : WARMUP + (k + 1) * events]
                pg_before, client_before, started = process_cpu_seconds(pid), own_cpu(), time.perf_counter()
                for first in range(0, len(chunk), size):
                    await process_batch(pool, [(event, 1) for event in chunk[first : first + size]], limits)
                seconds = time.perf_counter() - started
                pg_after = process_cpu_seconds(pid)
                pg = pg_after - pg_before if pg_after is not None and pg_before is not None else None
                costs.append(BatchCost(size, len(chunk), seconds, pg, own_cpu() - client_before))
            return costs
        finally:
            await pool.close()
    finally:
        await sandbox.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.batches",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "sizes", nargs="*", type=int, default=[1, 8, 32, 1, 32], help="batch sizes, in order (1 8 32 1 32)"
    )
    parser.add_argument("--events", type=int, default=3000, help="events per batch size (3000)")
    args = parser.parse_args(argv)
    if args.events < 1 or any(size < 1 for size in args.sizes):
        parser.error("--events and every batch size must be at least 1")
    costs = asyncio.run(measure(load_settings().postgres_dsn, args.sizes, args.events))
    print(HEADER)
    for cost in costs:
        print(cost.row())
    return 0


if __name__ == "__main__":
    sys.exit(main())
