"""``python -m bench memory``'s stall and what is watched meanwhile: Postgres locked by a connection of the
bench's own, the events published into it, the worker's RSS and the broker's unacked deliveries sampled,
and every result as it comes back."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import orjson
from aio_pika.abc import AbstractIncomingMessage

from bench.memory_events import SHARD, TOPOLOGY, EventShape
from sim.process import ModuleProcess
from sim.shard import EVENT_TYPE, ShardLink
from worker.broker.topology import shard_queue_name
from worker.testing.management import ManagementApi


@dataclass
class Answers:
    """Every result, by event id: when it came and how many copies."""

    arrived: dict[str, float] = field(default_factory=dict)
    copies: Counter[str] = field(default_factory=Counter)
    status: dict[str, str] = field(default_factory=dict)
    more: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_result(self, message: AbstractIncomingMessage) -> None:
        result = orjson.loads(message.body)
        event_id = result["event_id"]
        if event_id not in self.arrived:
            self.arrived[event_id] = time.monotonic()
            self.status[event_id] = str(result.get("status"))
        self.copies[event_id] += 1
        self.more.set()

    async def on_notice(self, message: AbstractIncomingMessage) -> None:
        return None

    async def wait(self, ids: list[str], deadline: float, alive: ModuleProcess) -> bool:
        """Until every one of ``ids`` is answered (True), ``deadline`` (monotonic) passes or the worker
        exits."""
        while any(i not in self.arrived for i in ids):
            self.more.clear()
            left = deadline - time.monotonic()
            if left <= 0 or not alive.running:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.more.wait(), min(left, 1.0))
        return True


def memory_kib(pid: int) -> tuple[int, int] | None:
    """VmRSS and VmHWM of ``pid`` in KiB (None when it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0])
    if len(found) < 2:
        return None
    return found["VmRSS"], found["VmHWM"]


@dataclass
class Samples:
    """The worker's RSS every ``interval`` seconds, and the broker's unacked deliveries every second."""

    pid: int
    interval: float
    rss: list[tuple[float, int]] = field(default_factory=list)
    hwm: int = 0
    unacked: list[tuple[float, int]] = field(default_factory=list)

    async def follow_rss(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            read = memory_kib(self.pid)
            if read is None:
                return
            self.rss.append((time.monotonic(), read[0]))
            self.hwm = max(self.hwm, read[1])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)

    async def follow_unacked(self, stop: asyncio.Event, api: ManagementApi, vhost: str) -> None:
        queues = (TOPOLOGY.work_queue, shard_queue_name(TOPOLOGY, SHARD))
        while not stop.is_set():
            total = 0
            for name in queues:
                with contextlib.suppress(Exception):
                    state = await asyncio.to_thread(api.queue, vhost, name)
                    total += int((state or {}).get("messages_unacknowledged", 0) or 0)
            self.unacked.append((time.monotonic(), total))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)


async def migrate(checkout: Path, env: dict[str, str]) -> None:
    """``worker migrate`` of the checkout under test (its own migrations)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "worker", "migrate",
        cwd=checkout, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        output, _ = await asyncio.wait_for(process.communicate(), 120)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise RuntimeError("worker migrate did not finish in 120 s") from None
    if process.returncode != 0:
        raise RuntimeError(f"worker migrate exited {process.returncode}: {output.decode()[-2000:]}")


@dataclass
class Stall:
    """Postgres stalled on a connection of the bench's own: the lock taken, then ``seconds`` of sleep."""

    dsn: str
    seconds: float
    locked_at: float = 0.0
    ended_at: float = 0.0
    _conn: asyncpg.Connection | None = None

    async def lock(self) -> None:
        self._conn = await asyncpg.connect(self.dsn, timeout=10)
        await self._conn.execute("BEGIN")
        await asyncio.wait_for(
            self._conn.execute("LOCK TABLE ltm_processed_events, servers IN ACCESS EXCLUSIVE MODE"), 30
        )
        self.locked_at = time.monotonic()

    async def hold(self) -> None:
        assert self._conn is not None, "lock first"
        try:
            await self._conn.execute("SELECT pg_sleep($1)", self.seconds, timeout=self.seconds + 30)
            await self._conn.execute("ROLLBACK")
        finally:
            self.ended_at = time.monotonic()
            await self._conn.close()


async def publish_all(link: ShardLink, shape: EventShape, count: int, window: int) -> tuple[list[str], float]:
    """``count`` events, ``window`` publishes awaiting a confirm; their ids and the seconds it took."""
    ids: list[str] = []
    started = time.monotonic()
    pending: set[asyncio.Future[None]] = set()
    for n in range(count):
        event_id, body = shape.event(n)
        ids.append(event_id)
        send = link.publish(body, message_id=event_id, type=EVENT_TYPE, mandatory=True, timeout=60)
        pending.add(asyncio.ensure_future(send))
        if len(pending) >= window:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for finished in done:
                finished.result()
    await asyncio.gather(*pending)
    return ids, time.monotonic() - started
