"""End-to-end harness: worker processes, a test shard speaking raw CONTRACT.md JSON, a Redis listener.

The shard deliberately does not use the project's models: it writes and reads plain JSON, as the
TypeScript bot does, so a contract drift in the models cannot hide here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import redis.asyncio as aioredis
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage, AbstractQueue

from contracts.models import ShardQueueKind, shard_queue

REPO = Path(__file__).resolve().parents[2]
TOOL_ROUTING_KEY = "tool.create_long_term_memory"
INVALIDATION_CHANNEL = "tomori:cache-invalidation"


class WorkerProcess:
    """``python -m worker run`` as a child process with its own log file."""

    def __init__(self, env: dict[str, str], log_path: Path, name: str = "worker") -> None:
        self.env = env
        self.log_path = log_path
        self.name = name
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> WorkerProcess:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "worker", "run", "--log-format", "json", *extra],
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def lines(self) -> list[dict[str, Any]]:
        """The JSON log lines written so far (non-JSON lines are skipped)."""
        out = []
        if not self.log_path.exists():
            return out
        for raw in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                line = json.loads(raw)
                if isinstance(line, dict):
                    out.append(line)
        return out

    def count(self, event: str) -> int:
        return sum(1 for line in self.lines() if line.get("event") == event)

    async def wait_for_log(self, event: str, *, at_least: int = 1, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.count(event) < at_least:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.name} exited ({self.proc.returncode}) before logging {event!r}:\n"
                    f"{self.log_path.read_text(errors='replace')[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.name} did not log {event!r} within {timeout}s:\n"
                    f"{self.log_path.read_text(errors='replace')[-3000:]}"
                )
            await asyncio.sleep(0.05)

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    async def wait_exit(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} still running after {timeout}s")
            await asyncio.sleep(0.05)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@dataclass
class Received:
    """What one shard received, by event id."""

    results: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    notices: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    result_messages: dict[str, list[AbstractIncomingMessage]] = field(
        default_factory=lambda: defaultdict(list)
    )
    notice_messages: dict[str, list[AbstractIncomingMessage]] = field(
        default_factory=lambda: defaultdict(list)
    )


class Shard:
    """A bot shard: publishes tool-call events and consumes its results and notices (plain JSON).

    It uses the contract's queue pattern, which the least-privilege ``bot`` user may: it checks the
    exchanges (passive) and declares and binds its durable queues ``tomori.shard.<id>.results`` and
    ``.notifications`` with ``shard.<id>``. The queues outlive it, like a real shard's over a restart, until
    the test's vhost goes; two shards with the same id at once would share them (no test does).
    ``declare_exchanges`` first declares the exchanges on a separate channel, standing in for the
    definitions file a production broker loads (a test may open its shard before any worker declared them).
    """

    def __init__(self, url: str, shard_id: int = 3, *, declare_exchanges: bool = True) -> None:
        self.url = url
        self.shard_id = shard_id
        self.declare_exchanges = declare_exchanges
        self.received = Received()
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._queues: list[AbstractQueue] = []

    async def __aenter__(self) -> Shard:
        self._connection = await aio_pika.connect_robust(self.url)
        if self.declare_exchanges:
            setup = await self._connection.channel()
            for name in ("tomori.tool_calls", "tomori.tool_results", "tomori.notifications"):
                await setup.declare_exchange(name, aio_pika.ExchangeType.TOPIC, durable=True)
            await setup.close()
        self._channel = await self._connection.channel(publisher_confirms=True)
        bindings: tuple[tuple[str, ShardQueueKind], ...] = (
            ("tomori.tool_results", "results"),
            ("tomori.notifications", "notifications"),
        )
        for exchange_name, kind in bindings:
            exchange = await self._channel.get_exchange(exchange_name)  # passive: checkExchange
            queue = await self._channel.declare_queue(shard_queue(self.shard_id, kind), durable=True)
            await queue.bind(exchange, f"shard.{self.shard_id}")
            await queue.consume(self._collector("result" if kind == "results" else "notice"))
            self._queues.append(queue)
        await self._channel.get_exchange("tomori.tool_calls")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._connection is not None:
            await self._connection.close()

    def _collector(self, kind: str) -> Callable[[AbstractIncomingMessage], Any]:
        async def collect(message: AbstractIncomingMessage) -> None:
            body = json.loads(message.body)
            event_id = body["event_id"]
            if kind == "result":
                self.received.results[event_id].append(body)
                self.received.result_messages[event_id].append(message)
            else:
                self.received.notices[event_id].append(body)
                self.received.notice_messages[event_id].append(message)
            await message.ack()

        return collect

    async def publish(
        self,
        body: dict[str, Any] | bytes,
        *,
        routing_key: str = TOOL_ROUTING_KEY,
        headers: dict[str, Any] | None = None,
    ) -> None:
        """Publish like the bot: persistent JSON with the ids in the AMQP properties, confirmed."""
        assert self._channel is not None
        if isinstance(body, bytes):
            message = aio_pika.Message(
                body, content_type="application/json", delivery_mode=2, headers=headers
            )
        else:
            message = aio_pika.Message(
                json.dumps(body).encode(),
                content_type="application/json",
                delivery_mode=2,
                message_id=str(body.get("event_id")),
                correlation_id=str(body.get("tool_call_id")),
                type="tool_call.v1",
                headers=headers,
            )
        exchange = await self._channel.get_exchange("tomori.tool_calls")
        await exchange.publish(message, routing_key)

    async def publish_many(self, bodies: Iterable[dict[str, Any]], window: int = 200) -> None:
        pending: set[asyncio.Task[None]] = set()
        for body in bodies:
            pending.add(asyncio.create_task(self.publish(body)))
            if len(pending) >= window:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()
        if pending:
            await asyncio.gather(*pending)

    async def settle(self, timeout: float = 10.0) -> None:
        """Wait until every result and notice already routed to this shard has been collected.

        Call it once nothing publishes any more (workers stopped): the queues then only drain.
        """
        assert self._channel is not None
        # a fresh passive declare on the raw channel: aio-pika's robust channel would answer a passive
        # declare with the queue object it already has, and its stale message count
        channel = await self._channel.get_underlay_channel()
        deadline = time.monotonic() + timeout
        for queue in self._queues:
            while True:
                declared = await channel.queue_declare(queue.name, passive=True)
                if not declared.message_count:
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"{queue.name} still holds {declared.message_count} messages after {timeout}s "
                        f"({declared.consumer_count} consumers)"
                    )
                await asyncio.sleep(0.05)
        # deliveries sent before the declare-ok on this channel are in; let their callbacks run
        await asyncio.sleep(0.2)

    async def wait_for_results(self, event_ids: Iterable[str], timeout: float = 60.0) -> None:
        wanted = set(event_ids)
        deadline = time.monotonic() + timeout
        while True:
            missing = wanted - set(self.received.results)
            if not missing:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(missing)} of {len(wanted)} events got no result in {timeout}s")
            await asyncio.sleep(0.05)


class InvalidationListener:
    """Collects the cache invalidations the worker publishes on Redis, by event id."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.messages: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._task: asyncio.Task[None] | None = None
        self._client: aioredis.Redis | None = None

    async def __aenter__(self) -> InvalidationListener:
        self._client = aioredis.Redis.from_url(self.url)
        pubsub = self._client.pubsub()
        await pubsub.subscribe(INVALIDATION_CHANNEL)
        self._task = asyncio.create_task(self._listen(pubsub))
        return self

    async def _listen(self, pubsub: Any) -> None:
        while True:
            try:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            except Exception:  # Redis restarted under the test: subscribe again
                await asyncio.sleep(0.2)
                with contextlib.suppress(Exception):
                    await pubsub.subscribe(INVALIDATION_CHANNEL)
                continue
            if message and message.get("type") == "message":
                body = json.loads(message["data"])
                self.messages[body.get("event_id", "")].append(body)

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._client is not None:
            await self._client.aclose()


@dataclass(frozen=True)
class DeadLetter:
    """A message taken out of ``ltm.create_memory.dlq`` by a test."""

    headers: dict[str, Any]
    body: bytes
    message_id: str | None
    correlation_id: str | None
    type: str | None
    routing_key: str | None


async def take_dead_letters(
    url: str, expected: int, *, timeout: float = 30.0, queue: str = "ltm.create_memory.dlq"
) -> list[DeadLetter]:
    """Take messages out of the DLQ until ``expected`` arrived (then a short quiet period to catch extras)."""
    found: list[DeadLetter] = []
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        dlq = await channel.declare_queue(queue, passive=True)
        deadline = time.monotonic() + timeout
        quiet_until: float | None = None
        while True:
            message = await dlq.get(fail=False, no_ack=True)
            if message is not None:
                found.append(
                    DeadLetter(
                        dict(message.headers or {}),
                        message.body,
                        message.message_id,
                        message.correlation_id,
                        message.type,
                        message.routing_key,
                    )
                )
                continue
            now = time.monotonic()
            if len(found) >= expected:
                quiet_until = quiet_until or now + 0.5
                if now >= quiet_until:
                    return found
            elif now > deadline:
                raise AssertionError(f"expected {expected} dead letters, got {len(found)} in {timeout}s")
            await asyncio.sleep(0.05)
    finally:
        await connection.close()


async def queue_depth(url: str, queue: str) -> int:
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        return int(declared.declaration_result.message_count or 0)
    finally:
        await connection.close()


def free_port() -> int:
    """A TCP port nobody listens on now (for a worker's HTTP server)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(port: int, path: str) -> tuple[int, str]:
    """``GET`` a worker's HTTP endpoint: status and body."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def wait_for_metric(port: int, line: str, timeout: float = 30.0) -> None:
    """Wait until a worker's ``/metrics`` has the line ``line`` (e.g. ``ltm_events_in_flight 4.0``)."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            _, text = await asyncio.to_thread(get, port, "/metrics")
            if line in text.splitlines():
                return
        await asyncio.sleep(0.05)
    found = [got for got in text.splitlines() if got.startswith(line.split(" ")[0])]
    raise AssertionError(f"/metrics never had {line!r} in {timeout}s; last: {found}")


async def metric(port: int, name: str) -> float:
    """The value of one sample on a worker's ``/metrics`` (``name`` with its labels, as exposed)."""
    _, text = await asyncio.to_thread(get, port, "/metrics")
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample == name:
            return float(value)
    raise AssertionError(f"/metrics has no sample {name!r}")
