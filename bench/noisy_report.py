"""What ``python -m bench noisy`` prints: B's latency and its parts, the queues left, what the workers moved
and logged, and the broker's redeliveries."""

from __future__ import annotations

import asyncio
import statistics
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import aio_pika
import asyncpg
import orjson

from bench.flood import percentile
from bench.noisy_cast import Answers, Shard
from bench.sandbox import management_url_from_env
from worker.testing.management import ManagementApi

#: the management API's statistics lag this much (collect_statistics_interval is 5 s by default)
STATS_SECONDS = 6.0


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
