"""End-to-end harness: worker processes, a test shard speaking raw CONTRACT.md JSON, a Redis listener.

The process runner and the shard's AMQP side are the simulators the bench uses too (``sim/``); this
module puts the tests' face on them: log lines to wait for, every message recorded. The shard
deliberately does not use the project's models: it writes and reads plain JSON, as the TypeScript bot
does, so a contract drift in the models cannot hide here.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import redis.asyncio as aioredis
from aio_pika.abc import AbstractIncomingMessage

from sim.process import CHECKOUT
from sim.shard import EVENT_TYPE, TOOL_ROUTING_KEY, ShardLink
from worker.testing.workers import WorkerProcess as ShippedWorkerProcess

REPO = Path(__file__).resolve().parents[2]
INVALIDATION_CHANNEL = "tomori:cache-invalidation"


class WorkerProcess(ShippedWorkerProcess):
    """``python -m worker run`` of this checkout as a child process with its own log file (JSON lines): the
    shipped stack's worker process (worker/testing/workers.py), its log lines for the tests to read."""

    def __init__(self, env: dict[str, str], log_path: Path, name: str = "worker") -> None:
        super().__init__(env, log_path, name, args=("run", "--log-format", "json"), cwd=CHECKOUT)


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


def event_id_of(body: bytes) -> str | None:
    """The ``event_id`` string of a JSON object body, else ``None``."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None
    event_id = parsed.get("event_id") if isinstance(parsed, dict) else None
    return event_id if isinstance(event_id, str) else None


class Shard:
    """A bot shard: publishes tool-call events and records every result and notice (plain JSON).

    The AMQP side is ``sim.shard.ShardLink``, the contract's queue pattern a shard's own user
    may use (the bench's shards use it too), on a robust connection, acking each message it records. The
    queues outlive it, like a real shard's over a restart, until the test's vhost goes; two shards with the
    same id at once would share them (no test does). ``declare_exchanges`` first declares the exchanges,
    standing in for the definitions file a production broker loads. ``user_id``: the AMQP ``user_id`` of every
    event (the URL's user, for a worker with ``LTM_SHARD_IDENTITY=required``); None sends none.
    """

    def __init__(
        self, url: str, shard_id: int = 3, *, declare_exchanges: bool = True, user_id: str | None = None
    ) -> None:
        self.url = url
        self.shard_id = shard_id
        self.declare_exchanges = declare_exchanges
        self.received = Received()
        self.link = ShardLink(url, shard_id, robust=True, user_id=user_id)

    async def __aenter__(self) -> Shard:
        await self.link.open(
            self._collector("result"),
            self._collector("notice"),
            no_ack=False,
            declare_exchanges=self.declare_exchanges,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.link.close(delete_queues=False)

    def _collector(self, kind: str) -> Callable[[AbstractIncomingMessage], Awaitable[None]]:
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
        """Publish like the bot: persistent JSON with the ids in the AMQP properties, confirmed.

        Raw bytes go with the ``message_id`` the bot would give them, the body's ``event_id`` when it has one:
        the worker refuses a ``message_id`` that is not the ``event_id`` (CONTRACT.md section 3), and aiormq
        would otherwise make one up (it tracks returns by ``message_id``)."""
        if isinstance(body, bytes):
            await self.link.publish(
                body, routing_key=routing_key, message_id=event_id_of(body), headers=headers
            )
            return
        await self.link.publish(
            json.dumps(body).encode(),
            routing_key=routing_key,
            message_id=str(body.get("event_id")),
            correlation_id=str(body.get("tool_call_id")),
            type=EVENT_TYPE,
            headers=headers,
        )

    async def publish_many(self, bodies: Iterable[dict[str, Any] | bytes], window: int = 200) -> None:
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
        assert self.link.consuming is not None
        # a fresh passive declare on the raw channel: aio-pika's robust channel would answer a passive
        # declare with the queue object it already has, and its stale message count
        channel = await self.link.consuming.get_underlay_channel()
        deadline = time.monotonic() + timeout
        for queue in self.link.queues:
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


def invalidation_key(event_id: str) -> str:
    """The ``invalidation_id`` of an event's invalidations, by CONTRACT.md's formula (written out here, not
    taken from the models, like everything this harness reads)."""
    return hashlib.sha256(f"tomori-ltm-invalidation:{event_id}".encode()).hexdigest()


class InvalidationListener:
    """Collects the cache invalidations the worker publishes on Redis, by ``invalidation_id``; :meth:`of`
    finds an event's (an invalidation names no event id: CONTRACT.md section 6)."""

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
                self.messages[body.get("invalidation_id", "")].append(body)

    def of(self, event_id: str) -> list[dict[str, Any]]:
        """The invalidations published for the event ``event_id`` (canonical, lower-case form)."""
        return self.messages.get(invalidation_key(event_id), [])

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
