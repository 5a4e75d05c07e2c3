"""``python -m bench noisy``'s run: the sandbox, the workers and the shards' links, the warm-up, the quiet
round, the floods beside B's trickle (a worker killed in it with ``--kill-after``), and the report."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.noisy_cast import Answers, Cast, Shard, event, seed, trickle
from bench.noisy_report import (
    _ledger_rows,
    _log_summary,
    _moved,
    _redeliveries,
    latency_line,
    processing_line,
    publishing_line,
    queue_depths,
)
from bench.sandbox import PrivateRedis, Sandbox, env_for_worker
from sim.process import CHECKOUT, ModuleProcess
from sim.shard import EVENT_TYPE, TOOL_ROUTING_KEY, ShardLink
from worker.broker.topology import shard_queue_name
from worker.config import Topology
from worker.store.migrate import apply_migrations
from worker.testing.workers import free_port

TOPOLOGY = Topology()
SHARDS_REPORT_AFTER = 3.0
#: B's latency is also given over the events it sent this soon after the flood's start
FIRST_SECOND = 1.0


async def run(args: argparse.Namespace) -> int:
    cast = Cast.of(args.loud, args.same_shard)
    sandbox = Sandbox(args.postgres_dsn)
    workdir = Path(tempfile.mkdtemp(prefix="ltm-noisy-"))
    redis = await PrivateRedis.start(workdir)
    workers: list[ModuleProcess] = []
    killed: ModuleProcess | None = None
    links: list[ShardLink] = []
    try:
        dsn = await sandbox.new_database("_noisy")
        url = await sandbox.new_vhost(args.rabbitmq_url)
        await apply_migrations(dsn)
        seeded = await seed(dsn, cast.guilds)
        env = env_for_worker(
            postgres_dsn=dsn,
            rabbitmq_url=url,
            redis_url=redis.url,
            extra={"MAX_SERVER_MEMORIES": "100000000"},
        )
        if args.shards_report:
            env["LTM_METRICS_INTERVAL_SECONDS"] = "1"  # the activity rows `worker shards` adds up
        for setting in args.set or []:
            name, _, value = setting.partition("=")
            env[name] = value
        checkout: Path = args.checkout or CHECKOUT
        http_ports = [free_port() for _ in range(args.workers)]
        log_paths = (
            [workdir / "worker.log"]
            if args.workers == 1
            else [workdir / f"worker-{i + 1}.log" for i in range(args.workers)]
        )
        for i, (port, log_path) in enumerate(zip(http_ports, log_paths, strict=True)):
            name = "worker" if args.workers == 1 else f"worker {i + 1}"
            worker_env = {**env, "LTM_HTTP_PORT": str(port)}
            worker = ModuleProcess(
                "worker", ["run", "--log-format", "json"], worker_env, log_path, name, cwd=checkout
            )
            workers.append(worker.start())
        env["LTM_HTTP_PORT"] = str(http_ports[0])  # `worker shards`: the first worker's settings
        answers = Answers()
        shards: dict[int, Shard] = {}
        for shard_id in cast.shards:
            link = ShardLink(url, shard_id, robust=False)
            await link.open(answers.on_result, answers.on_notice, no_ack=True, declare_exchanges=True)
            links.append(link)
            shards[shard_id] = Shard(link, args.path == "kit")
        for worker in workers:
            await worker.wait_for_log("consuming", timeout=120)
        if args.declare:
            print(await _declare(env, checkout, cast.shards), flush=True)
        flooders = [shards[t.shard_id] for t in cast.loud]
        b = cast.quiet
        trickler = shards[b.shard_id] if not args.same_shard else Shard(shards[0].link, args.path == "kit")
        if args.same_shard and args.own_channel:
            # B's publishes on a connection of their own, as shard 0's: they no longer wait behind A's on one
            # channel (what a shard whose guilds publish on channels of their own would see)
            own = ShardLink(url, 0, robust=False)
            await own.open(answers.on_result, answers.on_notice, no_ack=True, declare_exchanges=True)
            links.append(own)
            trickler = Shard(own, args.path == "kit")

        def b_event(n: int) -> tuple[str, bytes]:
            return event(b.shard_id, b.guild, seeded.personas[b.guild], 1_000_000 + n)

        # warm-up: one event per shard on the version-1 key, so each has its own queue before the kit path
        # (declared ahead, a shard on the kit publishes on its own key from the first)
        warm = []
        for shard_id in cast.shards:
            guild = cast.warm_guild(shard_id)
            event_id, body = event(shard_id, guild, seeded.personas[guild], -1 - shard_id)
            key = shards[shard_id].key if args.declare else TOOL_ROUTING_KEY
            await shards[shard_id].link.publish(
                body, routing_key=key, message_id=event_id, type=EVENT_TYPE, mandatory=True
            )
            warm.append(event_id)
        await answers.wait(warm, 60)
        await asyncio.sleep(1.0)  # the shard queues are declared beside the first events

        line = (
            f"worker of {checkout}; path {args.path}; B {'in' if args.same_shard else 'beside'} shard A; "
            f"B at {args.rate:g}/s; A floods {args.flood}; settings {' '.join(args.set or []) or 'defaults'}"
        )
        if args.workers != 1 or args.loud != 1 or args.kill_after is not None or args.declare:
            line += (
                f"; {args.workers} worker(s); {args.loud} loud tenant(s), shards "
                f"{', '.join(str(t.shard_id) for t in cast.loud)}, each flooding {args.flood} from one "
                f"guild; B is shard {b.shard_id}"
                + (
                    f"; the last worker killed {args.kill_after:g} s into the flood"
                    if args.kill_after is not None
                    else ""
                )
                + ("; shards declared ahead" if args.declare else "")
            )
        print(line, flush=True)
        done = asyncio.Event()
        done.set()
        quiet_ids = await trickle(trickler, b_event, args.rate, done, args.quiet_seconds)
        await answers.wait(quiet_ids, 60)
        print(latency_line("B quiet          ", trickler, answers, quiet_ids), flush=True)
        print(processing_line("  of which in process", log_paths, quiet_ids), flush=True)

        drained = asyncio.Event()
        loud_ids: list[list[str]] = [[] for _ in cast.loud]
        started = time.monotonic()

        async def flood(index: int) -> float:
            tenant, flooder, ids = cast.loud[index], flooders[index], loud_ids[index]
            persona = seeded.personas[tenant.guild]
            pending: set[asyncio.Future[None]] = set()
            unanswered: list[str] = []
            for n in range(args.flood):
                while args.unanswered and len(unanswered) >= args.unanswered:
                    answers.more.clear()
                    unanswered = [i for i in unanswered if i not in answers.arrived]
                    if len(unanswered) >= args.unanswered:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(answers.more.wait(), 1.0)
                event_id, body = event(tenant.shard_id, tenant.guild, persona, n)
                unanswered.append(event_id)
                ids.append(event_id)
                pending.add(asyncio.ensure_future(flooder.send(event_id, body)))
                if len(pending) >= args.window:
                    _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            await asyncio.gather(*pending)
            published = time.monotonic() - started
            await answers.wait(ids, args.timeout)
            return published

        async def floods() -> list[float]:
            try:
                return list(await asyncio.gather(*(flood(i) for i in range(len(cast.loud)))))
            finally:
                drained.set()

        async def kill_last(after: float) -> float:
            await asyncio.sleep(after)
            workers[-1].kill()
            return time.monotonic() - started

        flooding = asyncio.ensure_future(floods())
        killing = asyncio.ensure_future(kill_last(args.kill_after)) if args.kill_after is not None else None
        reporting = asyncio.ensure_future(_shards_report(env, checkout)) if args.shards_report else None
        b_ids = await trickle(trickler, b_event, args.rate, drained, 0)
        published = await flooding
        if killing is not None:
            if not killing.done():
                killing.cancel()
                print(
                    f"the last worker was not killed: the flood drained before {args.kill_after:g} s",
                    flush=True,
                )
            else:
                killed = workers[-1]
                print(
                    f"{killed.name} (pid {killed.pid}) SIGKILLed {killing.result():.2f} s into the flood",
                    flush=True,
                )
        if reporting is not None:
            print(await reporting, flush=True)
        await answers.wait(b_ids, 60)
        first_ids = [i for i in b_ids if trickler.sent[i] - started < FIRST_SECOND]
        beside = "B beside A's flood" if len(cast.loud) == 1 else "B beside the floods"
        print(latency_line(beside, trickler, answers, b_ids), flush=True)
        print(processing_line("  of which in process", log_paths, b_ids), flush=True)
        print(publishing_line("  of which to the broker's confirm", trickler, answers, b_ids), flush=True)
        print(
            latency_line("  of which sent in the flood's first second", trickler, answers, first_ids),
            flush=True,
        )
        print(
            publishing_line("    of those, to the broker's confirm", trickler, answers, first_ids), flush=True
        )
        for index, (tenant, ids) in enumerate(zip(cast.loud, loud_ids, strict=True)):
            done_at = [answers.arrived[i] for i in ids if i in answers.arrived]
            name = "A" if len(cast.loud) == 1 else f"A{index} (shard {tenant.shard_id}, guild {tenant.guild})"
            drain = (max(done_at) - started) if done_at else float("nan")
            print(
                f"{name}'s flood: {len(done_at)}/{len(ids)} answered; published in {published[index]:.2f} s, "
                f"drained {drain:.2f} s after its first publish",
                flush=True,
            )
        running = [(w, port) for w, port in zip(workers, http_ports, strict=True) if w is not killed]
        counts = [await _moved(port) for _, port in running]
        moved = [n for n in counts if n is not None]
        if moved and args.workers == 1:
            print(f"events the worker moved to their shard's own queue: {moved[0]}", flush=True)
        elif moved:
            print(
                f"events the workers moved to their shard's own queue: {sum(moved)} "
                f"(summed over the {len(moved)} worker(s) still running: {', '.join(map(str, moved))})",
                flush=True,
            )
        a_ids = [i for ids in loud_ids for i in ids]
        every = [*warm, *quiet_ids, *a_ids, *b_ids]
        missing = [i for i in every if i not in answers.arrived]
        doubled = [i for i in every if answers.copies[i] > 1]
        await asyncio.sleep(2.0)
        queues = [
            TOPOLOGY.work_queue,
            TOPOLOGY.dead_letter_queue,
            *(shard_queue_name(TOPOLOGY, s) for s in cast.shards),
        ]
        left = {name: n for name, n in (await queue_depths(url, queues)).items() if n}
        rows = await _ledger_rows(dsn)
        print(
            f"exactly once: {len(every)} events, {len(missing)} unanswered, {len(doubled)} answered twice, "
            f"{rows} ledger rows; queues left non-empty: {left or 'none'}",
            flush=True,
        )
        if args.logs is not None:
            for log_path in log_paths:
                print(_log_summary(log_path), flush=True)
            print(await _redeliveries(args.rabbitmq_url, sandbox.vhost, queues), flush=True)
        for worker in workers:
            if worker is not killed:
                worker.check_alive()
        return 0 if not missing and not left and rows == len(every) else 1
    finally:
        for link in links:
            await link.close(delete_queues=True)
        for worker in workers:
            worker.kill()
        await redis.stop()
        for problem in await sandbox.close():
            print(problem, file=sys.stderr)
        if args.logs is not None:
            _keep_logs(workdir, args.logs)
        shutil.rmtree(workdir, ignore_errors=True)


def _keep_logs(workdir: Path, keep: Path) -> None:
    keep.mkdir(parents=True, exist_ok=True)
    for log_path in workdir.glob("worker*.log"):
        shutil.copy(log_path, keep / log_path.name)


async def _declare(env: dict[str, str], checkout: Path, shard_ids: list[int]) -> str:
    """``worker shards --declare`` the shards (the workers' settings), what it printed; raise if it failed."""
    command = ["worker", "shards", "--declare", *map(str, shard_ids)]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", *command,
        cwd=checkout, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    text = f"$ {' '.join(command)}\n{out.decode().rstrip()}"
    if process.returncode != 0:
        raise RuntimeError(f"{text}\n(exit {process.returncode})")
    return text


async def _shards_report(env: dict[str, str], checkout: Path) -> str:
    """What ``worker shards --minutes 5`` prints 3 s into the flood (the worker's own settings)."""
    await asyncio.sleep(SHARDS_REPORT_AFTER)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "worker", "shards", "--minutes", "5",
        cwd=checkout, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    heading = f"$ worker shards --minutes 5   ({SHARDS_REPORT_AFTER:g} s into the flood)"
    return f"{heading}\n{out.decode().rstrip()}"
