"""``python -m bench memory``: the worker's memory while Postgres stalls and big events pile up (security
review 5, N-B).

A worker process of this checkout (or of ``--checkout``, to compare side by side), in a database and vhost of
its own (:class:`bench.sandbox.Sandbox`, removed after) with a private Redis, JSON logs, every setting at its
default but those given with ``--set``. Once it consumes (one small event answered), its idle RSS is read;
then a connection of the bench's own stalls Postgres for ``--stall`` seconds::

    BEGIN; LOCK TABLE ltm_processed_events, servers IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(<stall>)

and meanwhile one shard publishes ``--events`` valid events of ``--body-bytes`` each (just under the
contract's 256 KiB: 32 aliases a participant, as few participants as aliases of 253 characters need, or
``--participants`` with shorter aliases; ``memory_content`` empty unless ``--content``) into the common queue,
``--window`` publishes awaiting a confirm. The worker's VmRSS is read every ``--sample`` seconds from its
start to the end. After the stall the bench waits until every event is answered (its
result consumed from the shard's results queue) or ``--timeout``.

Printed: the worker's idle and peak RSS (and VmHWM), the peak less the idle, LTM_HELD_BYTES_MAX, the events
answered and answered exactly once, the rows of ``ltm_processed_events``, how long the drain took after the
stall, the broker's peak of unacked deliveries (the management API, sampled every second, itself refreshed
every few seconds) and its redeliveries (a delivery handed back counts towards the quorum queue's delivery
limit), what was left in the queues and dead-lettered (by reason), and the worker's log lines
that tell of the byte budget, its warnings and errors. Nothing is asserted: the figures are for the review's
follow-up. Exit status 0 when every event was answered once and no queue is left non-empty, 1 when not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import aio_pika
import asyncpg
import orjson
from aio_pika.abc import AbstractIncomingMessage

from bench.flood import BOT, CHANNEL, GUILD, TRIGGER, seed
from bench.noisy_report import _moved, queue_depths, worker_log_lines
from bench.sandbox import Sandbox, management_url_from_env
from contracts.models import MAX_ALIASES, MAX_LABEL, MAX_PARTICIPANTS
from sim.process import CHECKOUT, ModuleProcess
from sim.shard import EVENT_TYPE, ShardLink
from worker.broker.envelope import Unreadable, read_event
from worker.broker.topology import shard_queue_name
from worker.config import Topology, declared, env_of
from worker.testing.management import ManagementApi
from worker.testing.workers import free_port

TOPOLOGY = Topology()
SHARD = 0
#: the author of the events: bench.flood's triggering user (its seed makes the guild's and the user's rows)
AUTHOR = TRIGGER
#: an alias as long as the review's (a label may be 256 characters)
ALIAS_CHARS = 253
#: the contract's cap on a participant's aliases
ALIASES_PER_PARTICIPANT = MAX_ALIASES
#: the part of ``tool_call_id`` (255 bytes at most) that may pad a body to its exact size
TOOL_CALL_PAD_MAX = 240
#: the worker's log lines this bench counts (the last one only the code after 5755bd9 logs)
COUNTED = (
    "holding too many event bytes; the queues wait",
    "the queues are consumed again",
    "the common queue's window follows the bodies' size",
)
BYTE_BUDGET_LINES = (*COUNTED, "consuming")
#: the management API's statistics lag this much (collect_statistics_interval is 5 s by default)
STATS_SECONDS = 6.0


# ---------------------------------------------------------------------------------------------- the events


def _participants(aliases: int, last_alias: int = ALIAS_CHARS) -> list[dict[str, Any]]:
    """``aliases`` aliases of ``ALIAS_CHARS`` characters spread 32 a participant, the last one
    ``last_alias`` characters long."""
    people: list[dict[str, Any]] = []
    for n in range(aliases):
        if n % ALIASES_PER_PARTICIPANT == 0:
            i = len(people)
            people.append(
                {
                    "target_id": f"{1150000000000001000 + i}",
                    "display_label": f"Participant {i}",
                    "aliases": [],
                }
            )
        size = last_alias if n == aliases - 1 else ALIAS_CHARS
        letter = chr(ord("a") + n % 26)
        people[-1]["aliases"].append((f"{n:05d}" + letter * ALIAS_CHARS)[:size])
    return people


@dataclass(frozen=True)
class EventShape:
    """How every event of the run is built: the same participants, a ``tool_call_id`` padded so that each
    body is ``body_bytes`` long exactly (a UUID, a fixed-width count and a fixed-width time vary)."""

    persona_id: int
    content: str
    participants: list[dict[str, Any]]
    pad: int

    def event(self, n: int) -> tuple[str, bytes]:
        event_id = str(uuid.uuid4())
        body = {
            "schema_version": 1,
            "event_id": event_id,
            "tool_call_id": f"call_{n:08d}" + "p" * self.pad,
            "tool_name": "create_long_term_memory",
            "issued_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
            "shard_id": SHARD,
            "arguments": {"memory_content": self.content, "memory_scope": "server_wide"},
            "context": {
                "guild_disc_id": GUILD,
                "channel_disc_id": CHANNEL,
                "thread_id": None,
                "triggering_user_disc_id": AUTHOR,
                "bot_user_disc_id": BOT,
                "persona_id": self.persona_id,
                "reply_via": None,
                "participants": self.participants,
                "guild_members": [],
            },
        }
        return event_id, orjson.dumps(body)


def spread_shape(body_bytes: int, persona_id: int, content: str, participants: int) -> EventShape:
    """``participants`` participants of 32 aliases each, the aliases' lengths evened out so that every body
    is ``body_bytes`` long (the review's shape: many participants, aliases as long as they need to be)."""
    count = participants * ALIASES_PER_PARTICIPANT

    def people(extra: int) -> list[dict[str, Any]]:
        each, more = divmod(extra, count)
        made = _participants(count)
        n = 0
        for person in made:
            person["aliases"] = [
                (f"{(n := n + 1):05d}" + "x" * MAX_LABEL)[: 1 + each + (1 if n <= more else 0)]
                for _ in person["aliases"]
            ]
        return made

    bare = len(EventShape(persona_id, content, people(0), 0).event(0)[1])
    if bare > body_bytes:
        raise ValueError(f"--body-bytes {body_bytes} is less than {participants} participants take ({bare})")
    shape = EventShape(persona_id, content, people(body_bytes - bare), 0)
    if max(len(a) for p in shape.participants for a in p["aliases"]) > MAX_LABEL:
        raise ValueError(
            f"--participants {participants} cannot fill {body_bytes} B with aliases of {MAX_LABEL}"
        )
    assert len(shape.event(0)[1]) == body_bytes, "the body's size does not add up"
    return shape


def shape_for(body_bytes: int, persona_id: int, content: str) -> EventShape:
    """The participants and padding that make every body ``body_bytes`` long: as few participants as aliases
    of 253 characters need."""

    def size(aliases: int, last: int = ALIAS_CHARS, pad: int = 0) -> int:
        return len(EventShape(persona_id, content, _participants(aliases, last), pad).event(0)[1])

    most = ALIASES_PER_PARTICIPANT * MAX_PARTICIPANTS
    if size(0) > body_bytes:
        raise ValueError(f"--body-bytes {body_bytes} is less than an event without participants ({size(0)})")
    if size(most) < body_bytes:
        raise ValueError(f"--body-bytes {body_bytes} is more than the contract lets participants fill")
    low, high = 0, most  # size(low) <= body_bytes < size(high), or high fits exactly
    while high - low > 1:
        middle = (low + high) // 2
        if size(middle) <= body_bytes:
            low = middle
        else:
            high = middle
    short = body_bytes - size(low)
    if short <= TOOL_CALL_PAD_MAX:
        return EventShape(persona_id, content, _participants(low), short)
    # one more alias, shortened to fit (it costs more than TOOL_CALL_PAD_MAX, its text at most 253 of that)
    over = size(high) - body_bytes
    shape = EventShape(persona_id, content, _participants(high, ALIAS_CHARS - over), 0)
    assert len(shape.event(0)[1]) == body_bytes, "the body's size does not add up"
    return shape


def small_event(persona_id: int) -> tuple[str, bytes]:
    """The warm-up: one ordinary event, no participants."""
    return EventShape(persona_id, "", [], 0).event(99_999_999)


# ------------------------------------------------------------------------------------------- what is measured


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


# ------------------------------------------------------------------------------------------------- the run


async def run(args: argparse.Namespace) -> int:
    sandbox = Sandbox(args.postgres_dsn)
    workdir = Path(tempfile.mkdtemp(prefix="ltm-memory-"))
    log_path = workdir / "worker.log"
    redis_port = free_port()
    redis = await asyncio.create_subprocess_exec(
        "redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        cwd=workdir, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    worker: ModuleProcess | None = None
    link: ShardLink | None = None
    stop_sampling = asyncio.Event()
    sampling: list[asyncio.Future[None]] = []
    try:
        dsn = await sandbox.new_database("_memory")
        url = await sandbox.new_vhost(args.rabbitmq_url)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LTM_", "MAX_"))}
        env.update(env_of(postgres_dsn=dsn, rabbitmq_url=url, redis_url=f"redis://127.0.0.1:{redis_port}/0"))
        http_port = free_port()
        env.update(
            {"MAX_SERVER_MEMORIES": "100000000", "PYTHONUNBUFFERED": "1", "LTM_HTTP_PORT": str(http_port)}
        )
        for setting in args.set or []:
            name, _, value = setting.partition("=")
            env[name] = value
        checkout: Path = args.checkout or CHECKOUT
        await migrate(checkout, env)
        persona_id = await seed(dsn)
        if args.participants:
            shape = spread_shape(args.body_bytes, persona_id, args.content, args.participants)
        else:
            shape = shape_for(args.body_bytes, persona_id, args.content)
        sample_id, sample = shape.event(0)
        read = read_event(sample, sample_id)
        if isinstance(read, Unreadable):
            print(f"the bench's event is not valid: {read.kind}: {read.error}", file=sys.stderr)
            return 2
        aliases = [len(alias) for p in shape.participants for alias in p["aliases"]]
        budget_setting = next(s for s in declared() if s.var == "LTM_HELD_BYTES_MAX")
        budget = int(env.get("LTM_HELD_BYTES_MAX", budget_setting.default))

        worker = ModuleProcess(
            "worker", ["run", "--log-format", "json"], env, log_path, "worker", cwd=checkout
        ).start()
        samples = Samples(worker.pid, args.sample)
        sampling.append(asyncio.ensure_future(samples.follow_rss(stop_sampling)))
        api = _management(args.rabbitmq_url)
        if sandbox.vhost is not None and await asyncio.to_thread(api.answers):
            sampling.append(asyncio.ensure_future(samples.follow_unacked(stop_sampling, api, sandbox.vhost)))
        answers = Answers()
        link = ShardLink(url, SHARD, robust=False)
        await link.open(answers.on_result, answers.on_notice, no_ack=True, declare_exchanges=True)
        await worker.wait_for_log("consuming", timeout=120)
        warm_id, warm_body = small_event(persona_id)
        await link.publish(warm_body, message_id=warm_id, type=EVENT_TYPE, mandatory=True, timeout=60)
        if not await answers.wait([warm_id], time.monotonic() + 60, worker):
            raise RuntimeError(f"the warm-up event was not answered in 60 s:\n{worker.tail()}")
        await asyncio.sleep(2.0)
        idle = memory_kib(worker.pid)
        if idle is None:
            worker.check_alive()
            raise RuntimeError("cannot read the worker's memory")
        idle_rss = idle[0]
        print(
            f"worker of {checkout} (pid {worker.pid}); settings {' '.join(args.set or []) or 'defaults'}; "
            f"{args.events} events of {len(sample):,} B ({len(shape.participants)} participants, "
            f"{len(aliases)} aliases of up to {max(aliases, default=0)} characters, memory_content "
            f"{args.content!r}), {args.window} in flight; Postgres stalled {args.stall:g} s; "
            f"LTM_HELD_BYTES_MAX {budget:,} B",
            flush=True,
        )

        stall = Stall(dsn, args.stall)
        await stall.lock()
        holding = asyncio.ensure_future(stall.hold())
        publishing = asyncio.ensure_future(publish_all(link, shape, args.events, args.window))
        deadline = stall.locked_at + args.stall + args.timeout
        try:
            ids, published = await asyncio.wait_for(publishing, max(1.0, deadline - time.monotonic()))
        except TimeoutError:
            print(f"publishing did not end within {args.stall + args.timeout:g} s", file=sys.stderr)
            raise
        print(
            f"published {len(ids)} events in {published:.1f} s "
            f"({len(ids) * len(sample) / published / 2**20:.0f} MiB/s), "
            f"{time.monotonic() - stall.locked_at:.1f} s into the stall",
            flush=True,
        )
        await asyncio.wait_for(holding, args.stall + 60)
        all_answered = await answers.wait(ids, stall.ended_at + args.timeout, worker)
        done_at = time.monotonic()
        await asyncio.sleep(args.settle)  # late copies, and the RSS once the queue is empty
        stop_sampling.set()
        await asyncio.gather(*sampling, return_exceptions=True)
        after = memory_kib(worker.pid)
        alive = worker.running

        answered = [i for i in ids if i in answers.arrived]
        doubled = sum(1 for i in ids if answers.copies[i] > 1)
        last = max((answers.arrived[i] for i in answered), default=float("nan"))
        peak_at, peak_rss = max(samples.rss, key=lambda s: s[1], default=(stall.locked_at, 0))
        stall_rss = max(
            (kib for at, kib in samples.rss if stall.locked_at <= at <= stall.ended_at), default=0
        )
        unacked_peak = max((n for _, n in samples.unacked), default=None)
        moved = await _moved(http_port) if alive else None
        queues = [TOPOLOGY.work_queue, TOPOLOGY.dead_letter_queue, shard_queue_name(TOPOLOGY, SHARD)]
        left = {name: n for name, n in (await queue_depths(url, queues)).items() if n}
        letters = await dead_letters(url, left.get(TOPOLOGY.dead_letter_queue, 0))
        rows = await _ledger_rows(dsn)
        log = read_log(log_path)
        redelivered = None
        if len(sampling) > 1 and sandbox.vhost is not None:  # the management API answers
            await asyncio.sleep(max(0.0, done_at + STATS_SECONDS - time.monotonic()))
            redelivered = await broker_redeliveries(api, sandbox.vhost)

        print(f"idle RSS                    {_mib(idle_rss)}", flush=True)
        print(
            f"peak RSS                    {_mib(peak_rss)} ({(peak_at - stall.locked_at):.1f} s after the "
            "lock); "
            f"VmHWM {_mib(samples.hwm)}; during the stall {_mib(stall_rss)}"
        )
        print(f"peak - idle                 {_mib(peak_rss - idle_rss)}")
        print(f"RSS {args.settle:g} s after the drain   {_mib(after[0]) if after else 'worker gone'}")
        print(f"LTM_HELD_BYTES_MAX          {budget:,} B ({budget / 2**20:g} MiB)")
        print(
            f"answered                    {len(answered)}/{len(ids)}; "
            f"exactly once {len(answered) - doubled}, "
            f"more than once {doubled} ({sum(answers.copies[i] for i in ids) - len(answered)} extra copies); "
            f"by status {dict(Counter(answers.status[i] for i in answered))}"
        )
        print(f"ltm_processed_events rows   {rows} (the warm-up event included)")
        drained = last - stall.ended_at
        print(
            f"drain after the stall       {drained:.1f} s"
            + ("" if all_answered else f" (gave up: {'timeout' if alive else 'the worker exited'})")
            + f"; every answer {(done_at - stall.locked_at):.1f} s after the lock"
        )
        print(
            "broker unacked (peak)       "
            + (f"{unacked_peak:,} (management API, sampled)" if unacked_peak is not None else "not sampled")
        )
        print(f"moved to the shard's queue  {moved if moved is not None else 'not reported'}")
        print(
            f"queues left non-empty       {left or 'none'}; dead letters by reason {dict(letters) or 'none'}"
        )
        for message, count in log.counted.items():
            print(f"log {message!r}: {count}")
        print(
            "broker redeliveries         "
            + (
                f"{redelivered:,} (management API, ltm.create_memory and shard 0's queue)"
                if redelivered is not None
                else "not read"
            )
        )
        if log.notable:
            print("worker warnings and errors by message:")
            for message, count in log.notable.most_common(15):
                print(f"  {count:>6}  {message}")
        if log.byte_budget:
            print("the worker's byte-budget lines (first few):")
            for line in log.byte_budget:
                print(f"  {line}")
        if not alive:
            print(f"the worker exited: {worker.tail()}", file=sys.stderr)
        return 0 if all_answered and not doubled and not left else 1
    finally:
        stop_sampling.set()
        for task in sampling:
            task.cancel()
        if link is not None:
            await link.close(delete_queues=True)
        if worker is not None:
            worker.kill()
            if args.keep_log:
                shutil.copyfile(log_path, args.keep_log)
        redis.kill()
        await redis.wait()
        for problem in await sandbox.close():
            print(problem, file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)


async def _ledger_rows(dsn: str) -> int:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM ltm_processed_events"))
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--events", type=int, default=5000, help="events published during the stall (5000)")
    parser.add_argument(
        "--body-bytes", type=int, default=261_996, help="each event's size, under 262,144 (261996)"
    )
    parser.add_argument(
        "--participants",
        type=int,
        help="spread the bytes over this many participants of 32 aliases each, 1 to 100 (default: as few "
        "as aliases of 253 characters need, 32 for the default size)",
    )
    parser.add_argument("--content", default="", help="each event's memory_content (empty)")
    parser.add_argument("--stall", type=float, default=40.0, help="seconds Postgres is stalled (40)")
    parser.add_argument("--window", type=int, default=64, help="publishes awaiting a confirm (64)")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="after the stall, give up waiting for answers (300 s)"
    )
    parser.add_argument("--sample", type=float, default=0.2, help="seconds between RSS readings (0.2)")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds watched after the drain (3)")
    parser.add_argument("--set", action="append", metavar="LTM_X=V", help="a worker setting (repeatable)")
    parser.add_argument("--checkout", help="run the worker of another checkout (side-by-side comparisons)")
    parser.add_argument("--keep-log", type=Path, help="copy the worker's log here at the end")
    parser.add_argument("--postgres-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/")
    args = parser.parse_args(argv)
    if args.participants is not None and not 1 <= args.participants <= MAX_PARTICIPANTS:
        parser.error(f"--participants must be 1 to {MAX_PARTICIPANTS}")
    if args.events < 1 or args.window < 1 or args.stall < 0 or args.sample <= 0:
        parser.error("--events and --window must be at least 1, --stall 0 or more, --sample more than 0")
    args.checkout = Path(args.checkout).resolve() if args.checkout else None
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
