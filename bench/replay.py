"""``python -m bench replay``: ``worker dlq replay --rate`` beside a shard's live saves, and a replay
cancelled from another terminal, then finished (docs/dead-letters.md "A replay as an operation").

In a database and vhost of its own (:class:`bench.sandbox.Sandbox`, removed after) with a private Redis and
one worker process of this checkout at its defaults. The dead letters are full, valid server-wide saves of
shard 1, written to the DLQ the way the worker writes one whose retries all failed while Postgres was
unreachable (``transient_exhausted``: a replay helps). Shard 2 is the quiet shard: it saves at
``--live-rate`` a second through the kit (:class:`contracts.shard.LtmClient`, its own routing key), each call
timed from its scheduled send to its result (open loop). Every ``worker dlq`` command runs as a subprocess, as
an operator runs it.

1. **paced**: ``--letters`` dead letters; the quiet shard alone for ``--quiet-seconds`` (before), then
   ``worker dlq replay --rate R`` while it goes on (during). Prints the replay's wall time against
   letters/rate, its own time on record, the rounds' period (the audit's settle times, one per round), the
   quiet shard's p50/p99 before and during, and how long after the replay the worker answered the last
   letter.
2. **cancelled**: another ``--letters``; the replay at the same rate, its id read from ``worker dlq
   operations --json``, ``worker dlq cancel ID`` ``--cancel-after`` seconds in; the time from the cancel to
   the replay's exit; then the replay run again. Checks: every letter answered exactly once (its result on
   shard 1's queue, its ledger row and its memory counted in Postgres by event id), the DLQ and work queue
   empty, ``worker dlq history`` with both operations and their counts.
3. **steps**: another ``--letters``, replayed at the same rate in this process with each step of a round
   timed (:mod:`bench.replay_steps`): where the time goes when a replay falls behind its rate.

``worker dlq replay`` asks no question (it has no ``--yes``; ``purge`` has), so it runs with stdin closed.

Nothing here asserts a figure: the numbers are for BENCHMARKS.md. Exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aio_pika
import asyncpg
import orjson

from bench.noisy_cast import AUTHOR, BOT, Answers, event, seed
from bench.noisy_report import queue_depths
from bench.replay_steps import against_target, exactly_once, on_record, spread, where_the_time_goes
from bench.sandbox import PrivateRedis, Sandbox, env_for_worker
from contracts.shard import LtmClient, LtmClientError, user_of_url
from sim.process import CHECKOUT, ModuleProcess
from sim.shard import ShardLink
from worker.broker.events import tool_call_message
from worker.broker.headers import rfc3339
from worker.broker.topology import declare_topology
from worker.config import Topology, load_settings
from worker.store.migrate import apply_migrations
from worker.testing.workers import free_port

TOPOLOGY = Topology()
LETTER_SHARD, QUIET_SHARD = 1, 2
#: the letters of each scenario come from a guild of their own (their memories counted apart); the quiet one's
GUILDS = {"paced": "1150000000000000011", "cancelled": "1150000000000000012", "steps": "1150000000000000013"}
GUILDS["quiet"] = "1150000000000000002"
AUDIT_TABLES = "ltm_dlq_operations, ltm_dlq_operation_letters"
ERROR = "database unavailable: connection to 127.0.0.1:5432 refused"


@dataclass
class Live:
    """The quiet shard: ``rate`` saves a second through the kit, each timed from its scheduled send."""

    client: LtmClient
    persona: int
    rate: float
    calls: list[tuple[float, float | None]] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        started, n, calls = time.monotonic(), 0, set()
        while not stop.is_set():
            at = started + n / self.rate
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            calls.add(asyncio.ensure_future(self._call(at, n)))
            n += 1
        await asyncio.gather(*calls)

    async def _call(self, at: float, n: int) -> None:
        context: dict[str, object] = {
            "guild_disc_id": GUILDS["quiet"], "channel_disc_id": "1150000000000000100", "thread_id": None,
            "triggering_user_disc_id": AUTHOR, "bot_user_disc_id": BOT, "persona_id": self.persona,
            "reply_via": None, "participants": [], "guild_members": [],
        }  # fmt: skip
        arguments = {"memory_content": f"{{user}} says live fact {n}", "memory_scope": "server_wide"}
        try:
            await self.client.create_memory(tool_call_id=f"live_{n}", arguments=arguments, context=context)
            self.calls.append((at, (time.monotonic() - at) * 1000))
        except LtmClientError:
            self.calls.append((at, None))

    def between(self, start: float, end: float) -> str:
        ms = [took for at, took in self.calls if start <= at < end and took is not None]
        failed = sum(took is None for at, took in self.calls if start <= at < end)
        return spread(ms) + (f", {failed} failed or timed out" if failed else "")


async def fill(url: str, count: int, persona: int, guild: str, first: int) -> list[str]:
    """``count`` dead letters of shard 1 as the worker writes them after its retries failed; their ids."""
    connection = await aio_pika.connect(url, timeout=10)
    sender = user_of_url(url)  # RabbitMQ refuses a user_id other than the connection's own user
    ids = []
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        declared = await declare_topology(channel, load_settings({}).topology, [1000])
        now = datetime.now(UTC)
        for start in range(first, first + count, 500):
            publishes = []
            for n in range(start, min(first + count, start + 500)):
                event_id, body = event(LETTER_SHARD, guild, persona, n)
                ids.append(event_id)
                headers = {
                    "x-ltm-error": ERROR, "x-ltm-error-kind": "transient_exhausted", "x-ltm-attempts": 5,
                    "x-ltm-failed-at": rfc3339(now - timedelta(seconds=60)),
                }  # fmt: skip
                message = tool_call_message(
                    orjson.loads(body), body, app_id=f"tomori-shard-{LETTER_SHARD}", user_id=sender,
                    headers=headers,
                )  # fmt: skip
                publishes.append(declared.dead_letter.publish(message, "tool.create_long_term_memory"))
            await asyncio.gather(*publishes)
    finally:
        await connection.close()
    return ids


@dataclass
class Command:
    """A ``worker dlq`` subprocess: when it started; once ended, what it printed and its exit code."""

    args: list[str]
    started: float
    ended: float = 0.0
    code: int = -1
    out: str = ""
    err: str = ""

    @property
    def wall(self) -> float:
        return self.ended - self.started

    def __str__(self) -> str:
        said = self.out.splitlines()[-1] if self.out else self.err.strip()[-300:]
        return f"$ worker dlq {' '.join(self.args)}  -> exit {self.code} after {self.wall:.2f} s: {said}"


async def start(env: Mapping[str, str], *args: str) -> tuple[Command, asyncio.Task[Command]]:
    """Start ``python -m worker dlq *args`` (stdin not a terminal); the task ends with it."""
    command = Command(list(args), time.monotonic())
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "worker", "dlq", *args, cwd=CHECKOUT, env=dict(env),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip

    async def done() -> Command:
        out, err = await asyncio.wait_for(process.communicate(), 600)
        command.ended, command.out, command.err = time.monotonic(), out.decode().strip(), err.decode()
        command.code = process.returncode if process.returncode is not None else -1
        return command

    return command, asyncio.ensure_future(done())


async def run_dlq(env: Mapping[str, str], *args: str) -> Command:
    return await (await start(env, *args))[1]


def replay_args(rate: float, by: str) -> list[str]:
    return ["replay", "--rate", f"{rate:g}", "--by", by]


async def operation_id(env: Mapping[str, str], by: str, timeout: float = 30) -> str:
    """The running replay's id, as ``worker dlq operations --json`` lists it (by who runs it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in (await run_dlq(env, "operations", "--json")).out.splitlines():
            row = orjson.loads(line) if line.startswith("{") else {}
            if row.get("actor") == by and row.get("state") == "running":
                return str(row["operation_id"])
        await asyncio.sleep(0.2)
    raise RuntimeError(f"no running replay by {by} listed within {timeout:g} s")


async def in_postgres(dsn: str, ids: list[str], persona: int) -> tuple[int, int, int]:
    """Of ``ids``: ledger rows, letters without one; the persona's memories beyond one per letter."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetchval(
            "SELECT count(*) FROM ltm_processed_events WHERE event_id = ANY($1::uuid[])", ids
        )
        memories = await conn.fetchrow(
            "SELECT count(*) AS n, count(DISTINCT content) AS d FROM server_memories WHERE persona_id = $1",
            persona,
        )
    finally:
        await conn.close()
    return int(rows), len(ids) - int(rows), int(memories["n"]) - int(memories["d"])


async def answered(answers: Answers, ids: list[str], timeout: float = 180) -> float:
    """Wait until every one of ``ids`` has its result; when the last came (monotonic)."""
    await answers.wait(ids, timeout)
    return max((answers.arrived[i] for i in ids if i in answers.arrived), default=float("nan"))


async def paced(args: argparse.Namespace, ctx: Context, live: Live) -> None:
    ids = await ctx.letters(args.letters, "paced", 0)
    say(f"1. paced: {args.letters} transient_exhausted letters of shard {LETTER_SHARD} in the DLQ")
    stop = asyncio.Event()
    live_task = asyncio.ensure_future(live.run(stop))
    before = time.monotonic()
    await asyncio.sleep(args.quiet_seconds)
    replay = await run_dlq(ctx.env, *replay_args(args.rate, "bench-paced"))
    last = await answered(ctx.answers, ids)
    stop.set()
    await live_task
    took, rounds = await on_record(ctx.dsn, "bench-paced")
    n, rate, step = args.letters, args.rate, 1000 * max(1, round(args.rate * 0.1)) / args.rate
    say(f"   {replay}")
    say(f"   the command's wall time (Python's start included): {against_target(replay.wall, n, rate)}")
    say(f"   the operation on record (its start to its finish): {against_target(took, n, rate)}")
    say(f"   rounds (settle to settle; {step:.0f} ms planned): {spread(rounds)}")
    say(f"   the last letter answered {last - replay.ended:+.2f} s after the replay's exit")
    say(f"   quiet shard {QUIET_SHARD}, before the replay: {live.between(before, replay.started)}")
    say(f"   quiet shard {QUIET_SHARD}, during the replay: {live.between(replay.started, replay.ended)}")


async def cancelled(args: argparse.Namespace, ctx: Context) -> bool:
    persona = ctx.personas["cancelled"]
    ids = await ctx.letters(args.letters, "cancelled", 100_000)
    say(
        f"2. cancelled: {args.letters} more letters; replay at {args.rate:g}/s, `worker dlq cancel` "
        f"{args.cancel_after:g} s in from another process, then the replay run again"
    )
    first, replaying = await start(ctx.env, *replay_args(args.rate, "bench-cancelled"))
    op = await operation_id(ctx.env, "bench-cancelled")
    await asyncio.sleep(max(0.0, first.started + args.cancel_after - time.monotonic()))
    cancel = await run_dlq(ctx.env, "cancel", op, "--by", "bench-canceller")
    await replaying
    say(f"   {first}\n   {cancel}")
    say(f"   from the cancel's start to the replay's exit: {first.ended - cancel.started:.2f} s")
    kept = (await queue_depths(ctx.url, [TOPOLOGY.dead_letter_queue])).get(TOPOLOGY.dead_letter_queue, 0)
    say(f"   in the DLQ after the cancel: {kept}")
    again = await run_dlq(ctx.env, *replay_args(args.rate, "bench-finish"))
    say(f"   {again}")
    await answered(ctx.answers, ids)
    await asyncio.sleep(2.0)  # a copy answered twice would come now
    missing, doubled = exactly_once(ids, ctx.answers.copies)
    rows, no_row, extra = await in_postgres(ctx.dsn, ids, persona)
    queues = [TOPOLOGY.work_queue, TOPOLOGY.dead_letter_queue]
    left = {q: n for q, n in (await queue_depths(ctx.url, queues)).items() if n}
    say(
        f"   exactly once: {len(ids)} letters; their results: {missing} missing, {doubled} answered twice; "
        f"Postgres: {rows} ledger rows ({no_row} missing), {extra} memories saved twice; "
        f"queues left non-empty: {left or 'none'}"
    )
    history = await run_dlq(ctx.env, "history", "--limit", "2")
    say("   $ worker dlq history --limit 2\n" + "\n".join(f"   {line}" for line in history.out.splitlines()))
    listed = await run_dlq(ctx.env, "history", "--json", "--limit", "2")
    rows_of = [orjson.loads(line) for line in listed.out.splitlines() if line.startswith("{")]
    ops = {row["actor"]: row["letters"] for row in rows_of}
    both = ops.get("bench-cancelled", {}).get("replayed", 0) + ops.get("bench-finish", {}).get("replayed", 0)
    say(
        f"   history: the cancelled replay {ops.get('bench-cancelled')}, the one that finished it "
        f"{ops.get('bench-finish')}: {both} replayed between them"
    )
    clean = not (missing or doubled or no_row or extra or left)
    return clean and (first.code, cancel.code, again.code) == (130, 0, 0) and both == len(ids)


def say(text: str) -> None:
    print(text, flush=True)


@dataclass
class Context:
    env: dict[str, str]
    url: str
    dsn: str
    personas: dict[str, int]
    answers: Answers
    analyze: bool

    async def letters(self, count: int, scenario: str, first: int) -> list[str]:
        """``count`` dead letters from the scenario's guild; with ``--analyze``, ANALYZE then as autovacuum
        would on a server that runs it (this machine's Postgres runs with autovacuum off)."""
        ids = await fill(self.url, count, self.personas[scenario], GUILDS[scenario], first)
        if self.analyze:
            conn = await asyncpg.connect(self.dsn)
            try:
                await conn.execute(
                    "ANALYZE ltm_dlq_operations, ltm_dlq_operation_letters, ltm_processed_events"
                )
            finally:
                await conn.close()
        return ids


async def run(args: argparse.Namespace) -> int:
    sandbox = Sandbox(args.postgres_dsn)
    workdir = Path(tempfile.mkdtemp(prefix="ltm-replay-"))
    redis = await PrivateRedis.start(workdir)
    worker: ModuleProcess | None = None
    letters: ShardLink | None = None
    client: LtmClient | None = None
    try:
        dsn = await sandbox.new_database("_replay")
        url = await sandbox.new_vhost(args.rabbitmq_url)
        await apply_migrations(dsn)
        seeded = await seed(dsn, list(GUILDS.values()))
        env = env_for_worker(
            postgres_dsn=dsn,
            rabbitmq_url=url,
            redis_url=redis.url,
            extra={"MAX_SERVER_MEMORIES": "100000000"},
        )
        worker_env = {**env, "LTM_HTTP_PORT": str(free_port())}
        worker = ModuleProcess(
            "worker", ["run", "--log-format", "json"], worker_env, workdir / "worker.log", "worker"
        )
        worker.start()
        await worker.wait_for_log("consuming", timeout=120)
        answers = Answers()
        letters = ShardLink(url, LETTER_SHARD)
        await letters.open(answers.on_result, answers.on_notice, no_ack=True)
        client = await LtmClient.connect(url, QUIET_SHARD)
        personas = {name: seeded.personas[guild] for name, guild in GUILDS.items()}
        ctx = Context(env, url, dsn, personas, answers, args.analyze)
        live = Live(client, personas["quiet"], args.live_rate)
        say(
            f"one worker of {CHECKOUT} at its defaults; {args.letters} letters a scenario, replayed at "
            f"--rate {args.rate:g}; quiet shard {QUIET_SHARD} saving at {args.live_rate:g}/s through the kit"
        )
        if args.scenario in ("all", "paced"):
            await paced(args, ctx, live)
        ok = True
        if args.scenario in ("all", "cancelled"):
            ok = await cancelled(args, ctx)
        if args.scenario in ("all", "steps"):
            ids = await ctx.letters(args.letters, "steps", 200_000)
            say(f"3. where the time goes: {args.letters} more letters at {args.rate:g}/s, each step timed")
            say("\n".join(await where_the_time_goes(url, dsn, args.letters, args.rate)))
            await answered(answers, ids)
        worker.check_alive()
        return 0 if ok else 1
    finally:
        if client is not None:
            await client.close()
        if letters is not None:
            await letters.close(delete_queues=True)
        if worker is not None:
            worker.kill()
        await redis.stop()
        for problem in await sandbox.close():
            print(problem, file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench replay",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--letters", type=int, default=3000, help="dead letters in each scenario (3000)")
    p.add_argument("--rate", type=float, default=200.0, help="the replay's --rate, letters a second (200)")
    p.add_argument("--live-rate", type=float, default=10.0, help="the quiet shard's saves a second (10)")
    p.add_argument("--quiet-seconds", type=float, default=10.0, help="the quiet shard alone before (10)")
    p.add_argument("--cancel-after", type=float, default=5.0, help="seconds into the replay to cancel it (5)")
    p.add_argument("--scenario", choices=("all", "paced", "cancelled", "steps"), default="all")
    p.add_argument("--analyze", action="store_true", help="ANALYZE the record and the ledger before each")
    p.add_argument("--postgres-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.letters < 1 or args.rate <= 0 or args.live_rate <= 0:
        parser().error("--letters, --rate and --live-rate take a positive number")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
