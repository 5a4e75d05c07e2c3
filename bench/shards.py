"""The bench's shards: S AMQP connections that publish tool-call events and consume their own results.

Each shard is a ``sim.shard.ShardLink`` (shared with the e2e harness): its own connection, a confirm-mode
channel to publish on, and the two durable queues a bot shard declares (contracts/CONTRACT.md),
``tomori.shard.<id>.results`` and ``.notifications``, bound with ``shard.<id>``; it only checks the
exchanges, as a shard's own user must, and deletes its queues when it closes. A phase plays
a list of events per shard in one of two modes:

- closed loop: at most ``window`` events per shard are unanswered; a result frees a slot (throughput);
- open loop: events leave at a fixed total rate whatever happens, and the latency of each is measured
  from the time it was *scheduled* to leave, so a stall shows up in the latency of every event it
  delayed (no coordinated omission).

Latency is publish (or schedule) to result, taken on this process's monotonic clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aio_pika.abc import AbstractIncomingMessage

from bench.cpu import CpuUsage, snapshot, usage
from bench.workload import PlannedEvent
from sim.shard import EVENT_TYPE, ShardLink
from worker.config import Topology
from worker.redact import describe

PUBLISH_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    """As fast as possible, with at most ``window`` unanswered events per shard."""

    window: int

    def describe(self) -> str:
        return f"closed loop, window {self.window} per shard"


@dataclass(frozen=True, slots=True)
class OpenLoop:
    """``rate`` events per second in total, spread evenly over the shards."""

    rate: float

    def describe(self) -> str:
        return f"open loop, {self.rate:g} events/s offered"


LoadMode = ClosedLoop | OpenLoop


@dataclass
class PhaseResult:
    """What one phase published and got back."""

    name: str
    events: int
    started: float = 0.0
    finished: float = 0.0
    latencies: list[float] = field(default_factory=list)
    #: event id -> status of its first result
    received: dict[str, str] = field(default_factory=dict)
    duplicates: int = 0
    #: results or notices of events this phase did not publish
    stray: int = 0
    notices: set[str] = field(default_factory=set)
    notice_duplicates: int = 0
    result_bytes: int = 0
    notice_bytes: int = 0
    missing: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: CPU spent from the first publish to the last result
    cpu: CpuUsage | None = None

    @property
    def answered(self) -> int:
        return len(self.received)

    @property
    def duration(self) -> float:
        return max(self.finished - self.started, 1e-9)

    @property
    def throughput(self) -> float:
        return self.answered / self.duration

    @property
    def statuses(self) -> Counter[str]:
        return Counter(self.received.values())


class Progress:
    """What the progress line shows: the current phase and how far it is."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.name = ""
        self.total = 0
        self.done = 0
        self.in_flight: Callable[[], int] = lambda: 0
        self.started = time.monotonic()
        self._last = (time.monotonic(), 0)
        self._tty = sys.stderr.isatty()

    def begin(self, name: str, total: int, in_flight: Callable[[], int] | None = None) -> None:
        self.name, self.total, self.done = name, total, 0
        self.in_flight = in_flight or (lambda: 0)
        self.started = time.monotonic()
        self._last = (self.started, 0)

    def line(self) -> str:
        now = time.monotonic()
        then, done_then = self._last
        rate = (self.done - done_then) / max(now - then, 1e-9)
        self._last = (now, self.done)
        return (
            f"[bench] {self.name}: {self.done}/{self.total} answered, {rate:,.0f} events/s, "
            f"{self.in_flight()} in flight, {now - self.started:.1f} s"
        )

    def say(self, text: str) -> None:
        if self.enabled:
            self._clear()
            print(f"[bench] {text}", file=sys.stderr, flush=True)

    def _clear(self) -> None:
        if self._tty:
            print("\r\033[K", end="", file=sys.stderr, flush=True)

    async def run(self) -> None:
        """Print the progress line every second (in place on a terminal, every 5 s otherwise)."""
        if not self.enabled:
            return
        ticks = 0
        try:
            while True:
                await asyncio.sleep(1.0)
                ticks += 1
                if not self.name:
                    continue
                if self._tty:
                    print(f"\r\033[K{self.line()}", end="", file=sys.stderr, flush=True)
                elif ticks % 5 == 0:
                    print(self.line(), file=sys.stderr, flush=True)
        finally:
            self._clear()


class _Phase:
    """Book-keeping of one phase across every shard."""

    def __init__(self, name: str, event_ids: list[str], progress: Progress) -> None:
        events = len(event_ids)
        self.result = PhaseResult(name, events)
        self.ids = set(event_ids)
        self.pending: dict[str, float] = {}
        self.done = asyncio.Event()
        self.progress = progress
        self.last_answer = time.perf_counter()
        self.last_publish = self.last_answer
        if events == 0:
            self.done.set()

    def on_result(self, event_id: str, status: str, size: int) -> bool:
        """Record a result; ``True`` when it answered a pending event (frees a window slot)."""
        now = time.perf_counter()
        result = self.result
        sent = self.pending.pop(event_id, None)
        if sent is None:
            if event_id in result.received:
                result.duplicates += 1
            else:
                result.stray += 1  # not this phase's (a late copy from an earlier one)
            return False
        result.latencies.append(now - sent)
        result.received[event_id] = status
        result.result_bytes += size
        self.last_answer = now
        self.progress.done = result.answered
        if result.answered >= result.events:
            result.finished = now
            self.done.set()
        return True

    def on_notice(self, event_id: str, size: int) -> None:
        if event_id not in self.ids:
            self.result.stray += 1
        elif event_id in self.result.notices:
            self.result.notice_duplicates += 1
        else:
            self.result.notices.add(event_id)
            self.result.notice_bytes += size


class Shard:
    """One bot shard: a ``sim.shard.ShardLink`` (the e2e harness's shard uses it too) playing a phase."""

    def __init__(self, shard_id: int, url: str) -> None:
        self.shard_id = shard_id
        self.url = url
        self.phase: _Phase | None = None
        self.window: asyncio.Semaphore | None = None
        self.link = ShardLink(url, shard_id)

    async def open(self, topology: Topology) -> None:
        """Connect, declare and bind this shard's two queues, and consume them (no acks: speed).

        The exchanges must exist (the bench declares the topology first, as the definitions file does in
        production): a shard only checks them, since a shard's user may not declare exchanges.
        """
        await self.link.open(
            self._on_result,
            self._on_notice,
            no_ack=True,
            results_exchange=topology.results_exchange,
            notifications_exchange=topology.notifications_exchange,
            tool_calls_exchange=topology.tool_calls_exchange,
        )

    async def close(self) -> None:
        """Delete this shard's queues (the run is over: nothing in them is wanted) and disconnect."""
        await self.link.close(delete_queues=True)

    async def _on_result(self, message: AbstractIncomingMessage) -> None:
        phase = self.phase
        if phase is None:
            return
        body = orjson.loads(message.body)
        answered = phase.on_result(str(body.get("event_id")), str(body.get("status")), len(message.body))
        if answered and self.window is not None:
            self.window.release()

    async def _on_notice(self, message: AbstractIncomingMessage) -> None:
        if self.phase is not None:
            body = orjson.loads(message.body)
            self.phase.on_notice(str(body.get("event_id")), len(message.body))

    async def _publish(
        self, exchange: str, event: PlannedEvent, headers: Mapping[str, Any], phase: _Phase
    ) -> None:
        try:
            await self.link.publish(
                event.body,
                exchange=exchange,
                routing_key=event.routing_key,
                message_id=event.event_id,
                correlation_id=event.tool_call_id,
                type=EVENT_TYPE,
                headers={"traceparent": event.traceparent, **headers},
                mandatory=True,
                timeout=PUBLISH_TIMEOUT,
            )
        except Exception as exc:  # nack, unroutable, timeout, connection lost: the phase is void
            phase.result.errors.append(f"shard {self.shard_id}: publish failed: {describe(exc)}")
            phase.done.set()

    async def play(
        self,
        events: list[PlannedEvent],
        phase: _Phase,
        mode: LoadMode,
        exchange_name: str,
        headers: Callable[[PlannedEvent], Mapping[str, Any]],
        offset: float,
        interval: float,
    ) -> None:
        """Publish ``events`` in ``mode``; returns once every publish is confirmed (not answered).

        Open loop: event ``k`` is due at ``offset + k * interval`` after the phase started.
        """
        await self.link.exchange(exchange_name)  # looked up once, before the clock of the first event
        publishes: set[asyncio.Task[None]] = set()
        self.window = asyncio.Semaphore(mode.window) if isinstance(mode, ClosedLoop) else None
        for k, event in enumerate(events):
            if phase.result.errors:
                break
            if self.window is not None:
                await self.window.acquire()
                sent = time.perf_counter()
            else:
                sent = phase.result.started + offset + k * interval
                delay = sent - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            phase.pending[event.event_id] = sent
            phase.last_publish = time.perf_counter()
            task = asyncio.create_task(self._publish(exchange_name, event, headers(event), phase))
            publishes.add(task)
            task.add_done_callback(publishes.discard)
        if publishes:
            await asyncio.gather(*publishes)


class Shards:
    """The S shards of a run."""

    def __init__(self, url: str, count: int) -> None:
        self.url = url
        self.shards = [Shard(i, url) for i in range(count)]

    async def open(self, topology: Topology) -> None:
        await asyncio.gather(*(shard.open(topology) for shard in self.shards))

    async def close(self) -> None:
        await asyncio.gather(*(shard.close() for shard in self.shards))

    async def play(
        self,
        name: str,
        plan: list[list[PlannedEvent]],
        mode: LoadMode,
        *,
        exchange: str,
        progress: Progress,
        idle_timeout: float,
        headers: Callable[[PlannedEvent], Mapping[str, Any]] = lambda _: {},
        cpu_pids: Sequence[int] = (),
    ) -> PhaseResult:
        """Play ``plan[i]`` on shard ``i``; returns when every event is answered, or nothing came back
        for ``idle_timeout`` seconds after the last publish (the rest is reported missing).

        In a closed loop the last publish can be one that filled every window: when nothing was answered
        or published for ``idle_timeout`` seconds the consumers have stopped, and the phase ends with an
        error instead of waiting for a free slot for ever.
        """
        total = sum(len(events) for events in plan)
        phase = _Phase(name, [e.event_id for events in plan for e in events], progress)
        progress.begin(name, total, lambda: len(phase.pending))
        for shard in self.shards:
            shard.phase = phase
        before = snapshot(cpu_pids)
        phase.result.started = time.perf_counter()
        step = 1.0 / mode.rate if isinstance(mode, OpenLoop) else 0.0
        interval = step * len(self.shards)
        publishers = [
            asyncio.create_task(
                shard.play(events, phase, mode, exchange, headers, offset=i * step, interval=interval)
            )
            for i, (shard, events) in enumerate(zip(self.shards, plan, strict=True))
        ]
        publishing = asyncio.gather(*publishers)
        try:
            while not phase.done.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(phase.done.wait()), 1.0)
                now = time.perf_counter()
                quiet = now - phase.last_answer
                if publishing.done() and quiet > idle_timeout:
                    break
                if isinstance(mode, ClosedLoop) and min(quiet, now - phase.last_publish) > idle_timeout:
                    phase.result.errors.append(
                        f"no result and no free window slot for {idle_timeout:g} s: the consumers stopped "
                        "answering"
                    )
                    break
            phase.result.cpu = usage(before, snapshot(cpu_pids))
            if phase.result.errors:
                publishing.cancel()
            else:
                await publishing
        finally:
            for task in publishers:
                task.cancel()
            with contextlib.suppress(BaseException):
                await publishing
        result = phase.result
        if not result.finished:
            result.finished = phase.last_answer
        result.missing = list(phase.pending)
        # a notice is confirmed before its result is, but travels on its own queue: let the last land
        deadline = time.perf_counter() + 3.0
        seen = -1
        while len(result.notices) != seen and time.perf_counter() < deadline:
            seen = len(result.notices)
            await asyncio.sleep(0.3)
        for shard in self.shards:
            shard.phase = None
            shard.window = None
        progress.name = ""
        return result
