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
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.flood import seed
from bench.memory_events import SHARD, TOPOLOGY, shape_for, small_event, spread_shape
from bench.memory_report import (
    STATS_SECONDS,
    _ledger_rows,
    _management,
    _mib,
    broker_redeliveries,
    dead_letters,
    read_log,
)
from bench.memory_stall import Answers, Samples, Stall, memory_kib, migrate, publish_all
from bench.noisy_report import _moved, queue_depths
from bench.sandbox import PrivateRedis, Sandbox, env_for_worker
from contracts.models import MAX_PARTICIPANTS
from sim.process import CHECKOUT, ModuleProcess
from sim.shard import EVENT_TYPE, ShardLink
from worker.broker.envelope import Unreadable, read_event
from worker.broker.topology import shard_queue_name
from worker.config import declared
from worker.testing.workers import free_port


async def run(args: argparse.Namespace) -> int:
    sandbox = Sandbox(args.postgres_dsn)
    workdir = Path(tempfile.mkdtemp(prefix="ltm-memory-"))
    log_path = workdir / "worker.log"
    redis = await PrivateRedis.start(workdir)
    worker: ModuleProcess | None = None
    link: ShardLink | None = None
    stop_sampling = asyncio.Event()
    sampling: list[asyncio.Future[None]] = []
    try:
        dsn = await sandbox.new_database("_memory")
        url = await sandbox.new_vhost(args.rabbitmq_url)
        http_port = free_port()
        env = env_for_worker(postgres_dsn=dsn, rabbitmq_url=url, redis_url=redis.url)
        env.update({"MAX_SERVER_MEMORIES": "100000000", "LTM_HTTP_PORT": str(http_port)})
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
        await redis.stop()
        for problem in await sandbox.close():
            print(problem, file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)


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
