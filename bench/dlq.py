"""``python -m bench.dlq``: how long ``worker dlq`` takes over a DLQ of a few thousand dead letters.

In a vhost and database of its own (:class:`bench.sandbox.Sandbox`, removed after unless ``--keep``), fills
``ltm.create_memory.dlq`` with ``--letters`` dead letters of four kinds (``schema``, ``transient_exhausted``,
``internal``, ``event_conflict``; errors that differ by ids and numbers, eight shards, failures spread over
a day) the way the worker writes them, then times, ``--runs`` times each:

- ``keep``: once, the workers' keeper taking every copy into ``ltm_dead_letters`` (letters a second);
- ``list``: ``worker dlq list`` (one line per letter, to a buffer) in this process, from the kept letters;
- ``group by kind / error / shard``: ``worker dlq list --group-by ...``, likewise;
- ``list (shell)``, ``group by kind (shell)``: the same as a ``python -m worker dlq`` process, start to end;
- then whether the broker delivered any letter meanwhile (the head letter's ``x-delivery-count``, read once
  at the end: absent when no one took it before);
- ``list --from-queue``, ``group by kind --from-queue``: a pass over the queue instead, for comparison;
- ``replay --dry-run``: the other way through the queue, the sweep ``replay`` and ``purge`` make
  (``basic.get`` per message), for comparison;
- ``expire``: once, at the end, ``worker dlq expire --retention 12h`` from the shell (the failures are
  spread over a day: about half are older), then what is left older than 12 h, in the queue (a pass over
  it) and in the table;
- ``page``: one GET of ``worker dlq ui``'s overview (a real ``worker dlq ui`` process; the server's whole
  work: a pass over the queue, the groups, the charts, the audit query) and, when chromium is installed,
  the page loaded in headless chromium (``--dump-dom``, the browser's start included).

Prints the median and worst of each. Nothing here asserts a figure: the numbers are for BENCHMARKS.md.
``--screenshots DIR`` also saves PNGs of the overview, of one letter, of a button's confirmation and of what
runs now (the docs' pictures).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import orjson

from bench.sandbox import Sandbox
from worker.broker.events import tool_call_message
from worker.broker.headers import rfc3339
from worker.broker.topology import declare_topology
from worker.config import Topology, env_of, load_settings, overridden_env
from worker.ops.dlq import Console, Selection, list_command, replay_command
from worker.store.migrate import apply_migrations
from worker.testing.dead_letters import keep_copies

KINDS = ("schema", "transient_exhausted", "internal", "event_conflict")
REPO = Path(__file__).resolve().parents[1]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.dlq", description=__doc__.split("\n\n")[0])
    p.add_argument("--letters", type=int, default=3000, help="dead letters in the DLQ (3000)")
    p.add_argument("--runs", type=int, default=5, help="timed runs of each command (5)")
    p.add_argument(
        "--postgres-dsn", help="a server where the bench may create a database (env LTM_POSTGRES_DSN)"
    )
    p.add_argument(
        "--rabbitmq-url", help="the broker (env LTM_RABBITMQ_URL); a vhost is made with rabbitmqctl"
    )
    p.add_argument(
        "--screenshots",
        metavar="DIR",
        help="save PNGs of the page (overview, one letter, a confirmation, what runs now) here",
    )
    p.add_argument("--keep", action="store_true", help="keep the vhost and database (and say where)")
    return p


def letter(n: int, now: datetime) -> tuple[dict[str, Any], str, str]:
    """The n-th dead letter: its body, kind and error."""
    kind = KINDS[n % len(KINDS)]
    event_id = str(uuid.uuid4())
    error = {
        "schema": f"envelope breaks the contract: unknown schema_version {2 + n % 5}",
        "transient_exhausted": f"database unavailable: connection to 10.0.0.{n % 3 + 4}:5432 refused",
        "internal": f"KeyError: 'persona' (event {event_id})",
        "event_conflict": "event_id conflict: the ledger holds this event_id for a different event",
    }[kind]
    body = {
        "schema_version": 1,
        "event_id": event_id,
        "tool_call_id": f"call_{n}",
        "tool_name": "create_long_term_memory",
        "issued_at": rfc3339(now),
        "shard_id": n % 8,
        "arguments": {"memory_content": f"{{user}} likes dogs ({n})", "memory_scope": "server_wide"},
        "context": {"guild_disc_id": "1150000000000000001", "persona_id": 7},
    }
    return body, kind, error


async def fill(url: str, count: int) -> None:
    settings = load_settings({})
    connection = await aio_pika.connect(url, timeout=10)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        declared = await declare_topology(channel, settings.topology, [1000])
        now = datetime.now(UTC)
        for start in range(0, count, 500):
            publishes = []
            for n in range(start, min(count, start + 500)):
                body, kind, error = letter(n, now)
                failed_at = now - timedelta(seconds=86400 * (count - n) / count)
                message = tool_call_message(
                    body,
                    orjson.dumps(body),
                    app_id=f"tomori-shard-{body['shard_id']}",
                    headers={
                        "x-ltm-error": error,
                        "x-ltm-error-kind": kind,
                        "x-ltm-attempts": 5 if kind == "transient_exhausted" else 1,
                        "x-ltm-failed-at": rfc3339(failed_at),
                    },
                )
                publishes.append(
                    declared.dead_letter.publish(message, "tool.create_long_term_memory", mandatory=True)
                )
            await asyncio.gather(*publishes)
    finally:
        await connection.close()


async def timed(runs: int, work: Callable[[], Awaitable[object]]) -> list[float]:
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        await work()
        seconds.append(time.perf_counter() - started)
    return seconds


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


async def run_chromium(*args: str) -> None:
    browser = chromium()
    assert browser is not None
    with tempfile.TemporaryDirectory(prefix="ltm-chromium-") as profile:
        flags = ["--headless", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={profile}", *args]
        if os.geteuid() == 0:
            flags.insert(0, "--no-sandbox")
        process = await asyncio.create_subprocess_exec(
            browser, *flags, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        await asyncio.wait_for(process.wait(), 120)


def _dlq_environment(url: str, dsn: str) -> dict[str, str]:
    """The environment of a ``worker dlq`` command on the bench's broker and database: no other setting of
    this shell (every ``LTM_`` variable left out), so the rest are the defaults."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LTM_")}
    return env | env_of(rabbitmq_url=url, postgres_dsn=dsn)


async def start_ui(url: str, dsn: str) -> tuple[asyncio.subprocess.Process, str]:
    """``worker dlq ui`` started; the URL it printed, its token in it (the page makes one on loopback)."""
    env = _dlq_environment(url, dsn)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "worker", "dlq", "ui", "--port", "0",
        cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert process.stdout is not None
    line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
    found = re.search(r"(http://\S+/\?token=\S+)", line)
    if found is None:
        process.terminate()
        raise RuntimeError(f"worker dlq ui did not start: {line!r}")
    return process, found.group(1)


async def shell(env: dict[str, str], *args: str, show: bool = False) -> str:
    """``python -m worker dlq ARGS`` as a person runs it (its output kept, printed to stderr with ``show``);
    fails unless it exits 0. Its stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "worker", "dlq", *args,
        cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"worker dlq {' '.join(args)} exited {process.returncode}: {err.decode()}")
    if show:
        print(out.decode().strip(), file=sys.stderr)
    return err.decode()


async def left_after_expire(url: str, dsn: str, topology: Topology, env: dict[str, str]) -> None:
    """Print what is left older than the 12 h retention: in the DLQ (a pass over it) and in the table."""
    in_queue = await shell(env, "list", "--from-queue", "--older-than", "12h")
    print(f"after the expire, older than 12h in the queue: {in_queue.strip()}", file=sys.stderr)
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT state, count(*) AS n, count(*) FILTER (WHERE least(failed_at, kept_at) < now() - interval"
            " '12 hours') AS old FROM ltm_dead_letters GROUP BY state ORDER BY state"
        )
    finally:
        await conn.close()
    table = ", ".join(f"{row['state']} {row['n']} ({row['old']} older than 12h)" for row in rows)
    print(f"after the expire, in {topology.dead_letter_queue}'s table: {table or 'nothing'}", file=sys.stderr)


async def head_deliveries(url: str, queue: str) -> int:
    """How often the broker delivered the letter at the head of ``queue`` before now (its
    ``x-delivery-count``; absent: never). Takes it once and puts it back."""
    connection = await aio_pika.connect(url, timeout=10)
    try:
        channel = await connection.channel()
        dlq = await channel.get_queue(queue, ensure=False)
        message = await dlq.get(no_ack=False, fail=True)
        assert message is not None
        count = (message.headers or {}).get("x-delivery-count", 0)
        await message.nack(requeue=True)
        return int(count) if isinstance(count, int) else 0
    finally:
        await connection.close()


def fetch(url: str) -> str:
    """GET the page at ``url`` (``...?token=...``): the token as a bearer, since urllib keeps no cookie."""
    base, _, token = url.partition("?token=")
    request = urllib.request.Request(base, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return str(response.read().decode())


async def run(args: argparse.Namespace) -> dict[str, list[float]]:
    given = {option: getattr(args, option) or None for option in ("postgres_dsn", "rabbitmq_url")}
    settings = load_settings(overridden_env(os.environ, **given))
    sandbox = Sandbox(settings.postgres_dsn, keep=args.keep)
    results: dict[str, list[float]] = {}
    try:
        dsn = await sandbox.new_database()
        await apply_migrations(dsn)
        url = await sandbox.new_vhost(settings.rabbitmq_url)
        started = time.perf_counter()
        await fill(url, args.letters)
        print(f"filled {args.letters} dead letters in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        topology = settings.topology

        def quiet() -> Console:
            return Console(out=io.StringIO(), err=io.StringIO())

        started = time.perf_counter()
        kept = await keep_copies(url, dsn, topology)
        keeping = time.perf_counter() - started
        print(f"kept {kept} letters in {keeping:.1f} s ({kept / keeping:.0f} a second)", file=sys.stderr)
        results["list"] = await timed(
            args.runs, lambda: list_command(url, topology, Selection(), console=quiet(), dsn=dsn)
        )
        for by in ("kind", "error", "shard"):

            def grouped(by: str = by) -> Awaitable[int]:
                return list_command(url, topology, Selection(), group_by=by, console=quiet(), dsn=dsn)

            results[f"group by {by}"] = await timed(args.runs, grouped)
        env = _dlq_environment(url, dsn)
        results["list (shell)"] = await timed(args.runs, lambda: shell(env, "list"))
        results["group by kind (shell)"] = await timed(
            args.runs, lambda: shell(env, "list", "--group-by", "kind")
        )
        delivered = await head_deliveries(url, topology.dead_letter_queue)
        print(f"the DLQ's head letter was delivered {delivered} time(s) before the check", file=sys.stderr)
        results["list --from-queue"] = await timed(
            args.runs, lambda: list_command(url, topology, Selection(), console=quiet())
        )
        results["group by kind --from-queue"] = await timed(
            args.runs, lambda: list_command(url, topology, Selection(), group_by="kind", console=quiet())
        )
        # the pass replay and purge make (basic.get per message; --dry-run moves nothing)
        results["replay --dry-run"] = await timed(
            args.runs, lambda: replay_command(url, topology, Selection(), dry_run=True, console=quiet())
        )
        process, page = await start_ui(url, dsn)
        try:
            results["page (HTTP GET /)"] = await timed(args.runs, lambda: asyncio.to_thread(fetch, page))
            if chromium() is not None:
                results["page in chromium"] = await timed(args.runs, lambda: run_chromium("--dump-dom", page))
                if args.screenshots:
                    await audit_example(url, dsn)
                    await screenshots(page, Path(args.screenshots), url, dsn)
        finally:
            process.terminate()
            await process.wait()
        results["expire --retention 12h (shell)"] = await timed(
            1, lambda: shell(env, "expire", "--retention", "12h", "--by", "bench", show=True)
        )
        await left_after_expire(url, dsn, topology, env)
    finally:
        for line in await sandbox.close():
            print(line, file=sys.stderr)
    return results


async def audit_example(url: str, dsn: str) -> None:
    """Something for the pictures' audit history: a small replay and a purge refused for want of a --yes."""
    env = _dlq_environment(url, dsn)
    for args in (
        ("replay", "--group", "kind=schema", "--limit", "5", "--by", "alice (on call)"),
        ("purge", "--group", "shard=3", "--by", "bob"),
    ):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "worker", "dlq", *args,
            cwd=REPO, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        await process.wait()


async def screenshots(page: str, folder: Path, url: str, dsn: str) -> None:
    await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
    await run_chromium("--window-size=1400,2400", f"--screenshot={folder / 'dlq-ui-overview.png'}", page)
    overview = await asyncio.to_thread(fetch, page)
    sample = re.search(r"/letter\?id=([0-9a-f-]{36})", overview)
    if sample is not None:
        await run_chromium(
            "--window-size=1400,1900",
            f"--screenshot={folder / 'dlq-ui-letter.png'}",
            page.replace("/?token=", f"/letter?id={sample[1]}&token="),
        )
    # a button's confirmation, for a kind a replay cannot help (the second yes it asks for)
    await run_chromium(
        "--window-size=1400,900",
        f"--screenshot={folder / 'dlq-ui-confirm.png'}",
        page.replace("/?token=", "/confirm?action=replay&by=kind&value=schema&token="),
    )
    await operations_picture(page, folder, url, dsn)
    print(f"screenshots in {folder}", file=sys.stderr)


async def operations_picture(page: str, folder: Path, url: str, dsn: str) -> None:
    """What runs now, with its cancel button: a slow replay, pictured, then stopped as a first Ctrl-C does."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "worker", "dlq", "replay", "--group", "kind=transient_exhausted", "--rate", "5",
        "--by", "alice (on call)",
        cwd=REPO, env=_dlq_environment(url, dsn), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await asyncio.sleep(3)  # on record as running, a few letters moved
        await run_chromium(
            "--window-size=1400,700",
            f"--screenshot={folder / 'dlq-ui-operations.png'}",
            page.replace("/?token=", "/operations?token="),
        )
    finally:
        process.send_signal(signal.SIGINT)
        await process.wait()


def table(results: dict[str, list[float]], letters: int) -> str:
    lines = [f"{letters} dead letters, {len(next(iter(results.values())))} runs each", ""]
    lines.append(f"{'command':<24}{'median s':>10}{'worst s':>10}")
    for name, seconds in results.items():
        lines.append(f"{name:<24}{statistics.median(seconds):>10.2f}{max(seconds):>10.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    results = asyncio.run(run(args))
    print(table(results, args.letters))
    return 0


if __name__ == "__main__":
    sys.exit(main())
