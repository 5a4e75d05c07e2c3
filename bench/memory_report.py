"""What ``python -m bench memory`` reads once the events are answered: the dead letters by reason, the
broker's redeliveries, the worker's log (the byte budget's lines, warnings and errors), the ledger's rows."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import aio_pika
import asyncpg
import orjson

from bench.memory_events import SHARD, TOPOLOGY
from bench.noisy_report import worker_log_lines
from bench.sandbox import management_url_from_env
from worker.broker.topology import shard_queue_name
from worker.testing.management import ManagementApi

#: the worker's log lines this bench counts (the last one only the code after 5755bd9 logs)
COUNTED = (
    "holding too many event bytes; the queues wait",
    "the queues are consumed again",
    "the common queue's window follows the bodies' size",
)
BYTE_BUDGET_LINES = (*COUNTED, "consuming")
#: the management API's statistics lag this much (collect_statistics_interval is 5 s by default)
STATS_SECONDS = 6.0


async def dead_letters(url: str, limit: int, seconds: float = 60.0) -> Counter[str]:
    """The dead-letter queue's letters by reason: the broker's (``x-death``, e.g. ``delivery_limit``) or the
    worker's (``x-ltm-error-kind``). They are taken off the queue (the vhost is removed after anyway)."""
    reasons: Counter[str] = Counter()
    connection = await aio_pika.connect(url, timeout=10)
    try:
        channel = await connection.channel()
        try:
            queue = await channel.declare_queue(TOPOLOGY.dead_letter_queue, passive=True)
        except aio_pika.exceptions.ChannelClosed:
            return reasons
        deadline = time.monotonic() + seconds
        while sum(reasons.values()) < limit and time.monotonic() < deadline:
            message = await queue.get(no_ack=True, fail=False, timeout=10)
            if message is None:
                break
            headers = message.headers or {}
            deaths = headers.get("x-death")
            if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict):
                reasons[f"broker: {_text(deaths[0].get('reason'))}"] += 1
            else:
                reasons[f"worker: {_text(headers.get('x-ltm-error-kind'))}"] += 1
    finally:
        await connection.close()
    return reasons


async def broker_redeliveries(api: ManagementApi, vhost: str) -> int | None:
    """Deliveries the broker made again (``message_stats.redeliver``: handed back, or lost with a channel)
    on the common queue and the shard's own."""
    total = 0
    for name in (TOPOLOGY.work_queue, shard_queue_name(TOPOLOGY, SHARD)):
        try:
            state = await asyncio.to_thread(api.queue, vhost, name)
        except Exception:
            return None
        total += int(((state or {}).get("message_stats") or {}).get("redeliver", 0) or 0)
    return total


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@dataclass
class LogSummary:
    counted: dict[str, int]
    notable: Counter[str]
    byte_budget: list[str]


def read_log(path: Path, budget_lines: int = 12) -> LogSummary:
    """The counted lines, the warnings and errors by message, and the first of the byte budget's lines with
    their figures."""
    counted = dict.fromkeys(COUNTED, 0)
    notable: Counter[str] = Counter()
    budget: list[str] = []
    for line in worker_log_lines(path, notable):
        message = str(line.get("event", ""))
        if message in counted:
            counted[message] += 1
        if message in BYTE_BUDGET_LINES and len(budget) < budget_lines:
            figures = {
                k: v
                for k, v in line.items()
                if k in ("held_bytes", "held_events", "prefetch", "shard_prefetch", "timestamp")
            }
            budget.append(f"{message} {orjson.dumps(figures).decode()}")
    return LogSummary(counted, notable, budget)


def _mib(kib: int) -> str:
    return f"{kib / 1024:,.0f} MiB"


def _management(url: str) -> ManagementApi:
    parts = urlsplit(url)
    user, password = unquote(parts.username or "guest"), unquote(parts.password or "guest")
    base = management_url_from_env() or f"http://{parts.hostname or '127.0.0.1'}:15672"
    return ManagementApi.from_url(base, user, password)


async def _ledger_rows(dsn: str) -> int:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM ltm_processed_events"))
    finally:
        await conn.close()
