"""``python -m bench shard-queues``: what each shard's own queue costs the broker (docs/fair-shares.md).

For each count of shards (``--shards 64 1024``), in a vhost of its own on the broker of ``--rabbitmq-url``
(a local one: its memory is read with ``rabbitmq-diagnostics``): declare the worker's topology and one queue
per shard exactly as a worker does (``ltm.create_memory.shard.<N>``, quorum, bound with the shard's two keys),
consume each as one worker does (one channel, prefetch ``LTM_SHARD_PREFETCH``), wait for the broker to
settle, and print the queues, the time to declare and to consume them, and the broker's memory before and
after (its total, and the quorum queues' share: ``quorum_queue_procs`` + ``quorum_ets``). The vhost is
deleted at the end. Other clients of a shared broker move its total: run it on a quiet broker and compare
the lines of one run. The vhost gets the shipped bound on shard queues (policy ``ltm-shard-queue-bounds`` of
deploy/rabbitmq/definitions.json), as the worker's queues have it.

``--probe-connections``: how many shard queues the broker takes before it stops answering new connections
(deploy/README, "768"). Declare and consume them as above, ``--batch`` (25) at a time on one connection, up
to the largest ``--shards``; after each batch open a new AMQP connection (``--probe-timeout``, 10 s, for the
handshake) and print a table row: queues, connect time, and every ``--memory-every`` (100) queues the
node's memory (``/api/nodes`` with ``LTM_BENCH_RABBITMQ_MANAGEMENT_URL`` set, else ``rabbitmq-diagnostics``)
and its file-handle budget (``rabbitmq-diagnostics status``: the node ``RABBITMQ_NODENAME`` names). It stops
at the first connection that fails. Run it only on a broker of its own: past the limit nobody gets a new
connection to it. For one with Debian's limit beside the machine's own: run
``/usr/lib/rabbitmq/bin/rabbitmq-server`` under ``ulimit -n 1024``, with ``RABBITMQ_NODENAME``,
``RABBITMQ_CONF_ENV_FILE``, ``RABBITMQ_CONFIG_FILE`` (its listeners), ``RABBITMQ_ENABLED_PLUGINS_FILE``
(``[rabbitmq_management].``), ``RABBITMQ_MNESIA_BASE``, ``RABBITMQ_LOG_BASE``, ``RABBITMQ_DIST_PORT``,
``ERL_EPMD_PORT`` and ``HOME`` (its cookie) of its own, and the bench in the same environment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import aio_pika

from bench.sandbox import Sandbox, management_url_from_env
from worker.broker.topology import declare_shard_queue, declare_topology, shard_queue_name
from worker.config import Settings, Topology
from worker.service.policy import RetryPolicy
from worker.testing.management import ManagementApi

TOPOLOGY = Topology()
SETTLE_SECONDS = 5.0
DEFINITIONS = Path(__file__).resolve().parents[1] / "deploy" / "rabbitmq" / "definitions.json"
BOUNDS_POLICY = "ltm-shard-queue-bounds"
#: how long a read of the node's state may take in ``--probe-connections`` (past the limit it may hang)
STATE_TIMEOUT = 10.0


async def diagnostics(command: str, timeout: float = 120.0) -> Any:
    """``rabbitmq-diagnostics -q <command> --formatter json`` of the CLI's node (``RABBITMQ_NODENAME``, or its
    default), parsed; killed past ``timeout``."""
    process = await asyncio.create_subprocess_exec(
        "rabbitmq-diagnostics",
        "-q",
        command,
        "--formatter",
        "json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    return json.loads(out)


async def memory() -> dict[str, int]:
    """The local broker's memory by category (bytes), from ``rabbitmq-diagnostics memory_breakdown``."""
    data = await diagnostics("memory_breakdown")
    return {key: int(value["bytes"]) for key, value in data.items() if isinstance(value, dict)}


def shard_queue_policy() -> dict[str, Any] | None:
    """The shipped bound on shard queues (``ltm-shard-queue-bounds`` of definitions.json); None without it."""
    if not DEFINITIONS.exists():
        return None
    for policy in json.loads(DEFINITIONS.read_text(encoding="utf-8")).get("policies", []):
        if policy.get("name") == BOUNDS_POLICY:
            return dict(policy)
    return None


async def bound(sandbox: Sandbox) -> None:
    """Give the bench's vhost the shipped policy on shard queues, as a deployed vhost has it."""
    policy = shard_queue_policy()
    if policy is None:
        print(f"no policy {BOUNDS_POLICY} in {DEFINITIONS}: shard queues unbounded", file=sys.stderr)
        return
    await sandbox.set_policy(BOUNDS_POLICY, policy["pattern"], policy["definition"])


def quorum_bytes(mem: dict[str, int]) -> int:
    return mem.get("quorum_queue_procs", 0) + mem.get("quorum_ets", 0)


async def settled() -> dict[str, int]:
    await asyncio.sleep(SETTLE_SECONDS)
    return await memory()


async def one(count: int, base_url: str, admin_dsn: str, prefetch: int) -> str:
    sandbox = Sandbox(admin_dsn)
    try:
        url = await sandbox.new_vhost(base_url)
        await bound(sandbox)
        before = await settled()
        connection = await aio_pika.connect(url)
        try:
            channel = await connection.channel()
            await declare_topology(channel, TOPOLOGY, RetryPolicy.of(Settings()).tiers())
            started = time.monotonic()
            for shard_id in range(count):
                await declare_shard_queue(channel, TOPOLOGY, shard_id)
            declared = time.monotonic() - started
            consume = await connection.channel()
            await consume.set_qos(prefetch_count=prefetch)

            started = time.monotonic()
            for shard_id in range(count):
                queue = await consume.get_queue(shard_queue_name(TOPOLOGY, shard_id), ensure=False)
                await queue.consume(ignore)
            consumed = time.monotonic() - started
            after = await settled()
        finally:
            await connection.close()
    finally:
        for problem in await sandbox.close():
            print(problem, file=sys.stderr)
    total = (sum(after.values()) - sum(before.values())) / 2**20
    quorum = (quorum_bytes(after) - quorum_bytes(before)) / 2**20
    return (
        f"{count:>6} shards: {count + 6:>5} queues ({count} of them the shards'); "
        f"declared in {declared:.1f} s, consumed in {consumed:.1f} s; broker memory +{total:.0f} MiB in all "
        f"({total * 1024 / count:.0f} KiB a shard), quorum queues +{quorum:.0f} MiB "
        f"({quorum * 1024 / count:.0f} KiB a shard)"
    )


async def ignore(message: aio_pika.abc.AbstractIncomingMessage) -> None:
    return None


async def connect_time(url: str, timeout: float) -> tuple[float | None, str]:
    """Seconds to open (and handshake) a new connection, or None and why it failed within ``timeout``."""
    started = time.monotonic()
    try:
        connection = await asyncio.wait_for(aio_pika.connect(url, timeout=timeout), timeout)
    except TimeoutError:
        return None, f"no handshake in {timeout:.0f} s"
    except Exception as exc:  # refused, closed by the broker: the probe's answer, not the bench's failure
        return None, f"{type(exc).__name__}: {exc}"[:120]
    elapsed = time.monotonic() - started
    try:
        await asyncio.wait_for(connection.close(), timeout)
    except Exception as exc:
        return elapsed, f"opened, but did not close: {type(exc).__name__}"
    return elapsed, ""


async def handles() -> dict[str, int]:
    """The node's file-handle budget, used and limit, as ``rabbitmq-diagnostics status`` reports it
    (``total_used``, ``total_limit``, ``sockets_used``, ``sockets_limit``): what quorum queues and client
    sockets share before RabbitMQ 4.0. The CLI's node: ``RABBITMQ_NODENAME``, or its default."""
    status = await diagnostics("status", STATE_TIMEOUT)
    return {key: int(value) for key, value in status["file_descriptors"].items()}


async def node_state(management: ManagementApi | None) -> dict[str, Any]:
    """What could be read of the node within :data:`STATE_TIMEOUT` each: ``mem_used`` (the management API's
    ``/api/nodes``, else ``rabbitmq-diagnostics``) and the file-handle budget (:func:`handles`); a key
    ``*_error`` for a part that could not be read (past the limit ``status`` may hang)."""
    state: dict[str, Any] = {}
    try:
        if management is not None:
            nodes = await asyncio.to_thread(management.call, "GET", "/nodes", None, STATE_TIMEOUT)
            state.update({key: nodes[0][key] for key in ("name", "mem_used") if key in nodes[0]})
        elif shutil.which("rabbitmq-diagnostics") is not None:
            state["mem_used"] = sum((await asyncio.wait_for(memory(), STATE_TIMEOUT)).values())
    except Exception as exc:
        state["mem_error"] = type(exc).__name__
    if shutil.which("rabbitmq-diagnostics") is not None:
        try:
            state.update(await handles())
        except Exception as exc:
            state["handles_error"] = type(exc).__name__
    return state


async def first_state(management: ManagementApi | None) -> dict[str, Any]:
    """:func:`node_state`, waiting up to :data:`STATE_TIMEOUT` for a node just started to report memory."""
    deadline = time.monotonic() + STATE_TIMEOUT
    state = await node_state(management)
    while management is not None and "mem_used" not in state and time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        state = await node_state(management)
    return state


def state_cells(state: dict[str, Any]) -> str:
    mem = f"{state['mem_used'] / 2**20:.0f}" if "mem_used" in state else state.get("mem_error", "")
    fds = (
        f"{state['total_used']} / {state['total_limit']}"
        if "total_used" in state
        else state.get("handles_error", "")
    )
    sockets = f"{state['sockets_used']} / {state['sockets_limit']}" if "sockets_used" in state else ""
    return f"{mem} | {fds} | {sockets}"


def row(queues: int, seconds: float | None, why: str, cells: str) -> str:
    took = "**failed**" if seconds is None else f"{seconds:.2f} s"
    return f"| {queues} | {took}{f' ({why})' if why else ''} | {cells} |"


async def probe(args: argparse.Namespace) -> int:
    """``--probe-connections``: shard queues in batches, a new connection after each (module docstring)."""
    most = max(args.shards)
    management_url = management_url_from_env()
    management = None
    if management_url:
        parts = urlsplit(args.rabbitmq_url)
        user, password = unquote(parts.username or "guest"), unquote(parts.password or "guest")
        management = ManagementApi.from_url(management_url, user, password)
    sandbox = Sandbox(args.postgres_dsn)
    stopped = ""
    try:
        url = await sandbox.new_vhost(args.rabbitmq_url)
        await bound(sandbox)
        state = await first_state(management)
        print(
            f"node {state.get('name', '(name not read)')}; file handles and sockets from "
            f"rabbitmq-diagnostics, node {os.environ.get('RABBITMQ_NODENAME', '(the CLI default)')}",
            flush=True,
        )
        print(
            "| shard queues declared+consumed | new connection | node memory (MiB) "
            "| file handles used / limit | sockets used / limit |"
        )
        print("| --- | --- | --- | --- | --- |")
        seconds, why = await connect_time(url, args.probe_timeout)
        print(row(0, seconds, why, state_cells(state)), flush=True)
        connection = await aio_pika.connect(url, timeout=args.probe_timeout)
        try:
            channel = await connection.channel()
            await declare_topology(channel, TOPOLOGY, RetryPolicy.of(Settings()).tiers())
            consume = await connection.channel()
            await consume.set_qos(prefetch_count=args.prefetch)
            done = 0
            started = time.monotonic()
            while done < most:
                batch = range(done, min(done + args.batch, most))
                for shard_id in batch:
                    queue = await declare_shard_queue(channel, TOPOLOGY, shard_id)
                    queue = await consume.get_queue(queue.name, ensure=False)
                    await queue.consume(ignore)
                done = batch.stop
                seconds, why = await connect_time(url, args.probe_timeout)
                every = done % args.memory_every == 0 or seconds is None or done == most
                cells = state_cells(await node_state(management)) if every else " | | "
                print(row(done, seconds, why, cells), flush=True)
                if seconds is None:
                    stopped = f"new connections stopped at {done} shard queues ({why})"
                    break
            print(
                f"{done} shard queues declared and consumed in {time.monotonic() - started:.1f} s "
                "(connection probes included)"
            )
        finally:
            try:
                await asyncio.wait_for(connection.close(), args.probe_timeout)
            except Exception as exc:
                print(f"the bench's connection did not close: {type(exc).__name__}", file=sys.stderr)
    finally:
        for problem in await sandbox.close():
            print(problem, file=sys.stderr)
    print(stopped or f"new connections answered up to {most} shard queues", flush=True)
    return 0


async def run(args: argparse.Namespace) -> int:
    if args.probe_connections:
        return await probe(args)
    if shutil.which("rabbitmq-diagnostics") is None:
        print("rabbitmq-diagnostics is not installed: the broker's memory cannot be read", file=sys.stderr)
        return 2
    print(f"broker memory now: {sum((await memory()).values()) / 2**20:.0f} MiB", flush=True)
    for count in args.shards:
        print(await one(count, args.rabbitmq_url, args.postgres_dsn, args.prefetch), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench shard-queues", description=__doc__)
    parser.add_argument("--shards", type=int, nargs="+", default=[64, 1024], help="shard counts (64 1024)")
    parser.add_argument("--prefetch", type=int, default=Settings().shard_prefetch, help="per-queue prefetch")
    parser.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--postgres-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    probing = parser.add_argument_group("--probe-connections (only on a broker of its own)")
    probing.add_argument(
        "--probe-connections",
        action="store_true",
        help="up to the largest --shards, a new connection after each batch; stop at the first that fails",
    )
    probing.add_argument("--batch", type=int, default=25, help="shard queues between probes (25)")
    probing.add_argument("--probe-timeout", type=float, default=10.0, help="seconds for a handshake (10)")
    probing.add_argument("--memory-every", type=int, default=100, help="read the node every N queues (100)")
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
