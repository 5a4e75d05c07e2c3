"""``python -m tests.e2e.cluster_cpu [MESSAGES]``: what replicating a quorum queue costs RabbitMQ in CPU.

Starts a private single node, then a private 3-node cluster (tests/e2e/cluster.py; the machine's broker is
not touched), and on each pushes the same stream through one quorum queue declared on node 1: a publisher
with confirms (200 in flight) and a consumer with manual acks (prefetch 200), both connected to node 1, 1 KiB
bodies like a tool-call event. Prints the CPU each node's Erlang VM spent per message (from /proc), so
CAPACITY.md can use a measured replication factor instead of an assumed one.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import aio_pika

from tests.e2e.cluster import Node, RabbitCluster, find_server

QUEUE = "cpu.probe"
WINDOW = 200
BODY = b"x" * 1024


def cpu_seconds(node: Node) -> float:
    """User + system CPU of the node's Erlang VM so far."""
    pid = int((node.base / "rabbitmq.pid").read_text().strip())
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def push(url: str, messages: int) -> float:
    """Publish and consume ``messages`` through the quorum queue; the seconds it took."""
    connection = await aio_pika.connect(url)
    try:
        publish = await connection.channel(publisher_confirms=True)
        queue = await publish.declare_queue(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        consume = await connection.channel()
        await consume.set_qos(prefetch_count=WINDOW)
        received = 0
        done = asyncio.Event()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal received
            await message.ack()
            received += 1
            if received == messages:
                done.set()

        await (await consume.get_queue(QUEUE)).consume(on_message)
        started = time.monotonic()
        pending: set[asyncio.Future[object]] = set()
        for _ in range(messages):
            pending.add(
                asyncio.ensure_future(
                    publish.default_exchange.publish(aio_pika.Message(BODY, delivery_mode=2), QUEUE)
                )
            )
            if len(pending) >= WINDOW:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.gather(*pending)
        await done.wait()
        took = time.monotonic() - started
        await queue.delete(if_unused=False, if_empty=False)
        return took
    finally:
        await connection.close()


def measure(size: int, messages: int) -> None:
    bin_dir = find_server()
    if bin_dir is None:
        sys.exit("rabbitmq-server is not installed")
    cluster = RabbitCluster(bin_dir, size=size, management=False)
    try:
        cluster.start()
        cluster.add_vhost("cpu")
        url = cluster.nodes[0].url("cpu")
        asyncio.run(push(url, 2000))  # warm up (and the queue's first declaration)
        before = [cpu_seconds(node) for node in cluster.nodes]
        took = asyncio.run(push(url, messages))
        after = [cpu_seconds(node) for node in cluster.nodes]
        per_node = [(a - b) / messages * 1000 for a, b in zip(after, before, strict=True)]
        print(
            f"{size} node(s): {messages} messages in {took:.1f} s ({messages / took:,.0f}/s); "
            "CPU ms per message: "
            + ", ".join(f"node {i + 1} {ms:.3f}" for i, ms in enumerate(per_node))
            + f"; total {sum(per_node):.3f}"
        )
    finally:
        cluster.close()


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    for nodes in (1, 3):
        measure(nodes, count)
