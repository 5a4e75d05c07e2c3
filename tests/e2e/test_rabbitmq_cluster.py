"""A real three-node RabbitMQ cluster (started here from the installed rabbitmq-server, see cluster.py) loses
nodes under a stream of events: the node the worker is connected to, then the node that leads
``ltm.create_memory``; each comes back. Every event is answered, no memory is written twice, and the time
each fault takes to recover from is measured (printed, and recorded as the test's properties).

Layout: the topology is declared through node 2 first, so node 2 leads the work queue (the default leader
locator places a quorum queue's leader on the declaring client's node); the worker is given the nodes in
the order 1, 3, 2, so it consumes through node 1 and, once node 1 is gone, moves on to node 3; the test's
shard publishes and consumes through node 3, which no fault touches (a shard's own failover is the bot's
business, not the worker's).
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from contracts.models import Status
from tests.e2e.cluster import Node, RabbitCluster, private_rabbitmq, stack_on
from tests.e2e.stack import Stack
from tests.e2e.workload import (
    Stream,
    build_stream,
    check_outcome,
    limit_env,
    seed_scopes,
    wait_for_results,
)
from tests.support.harness import Shard
from tests.support.wait import eventually
from worker.broker.topology import declare_topology
from worker.config import Topology
from worker.service.policy import RetryPolicy

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

WORK_QUEUE = "ltm.create_memory"
#: events published per second by the shard, for as long as the faults last
RATE = 40
#: events published before the first fault, and between a node's return and the next fault
CALM = 120


@pytest.fixture(scope="module")
def rabbit_cluster() -> Iterator[RabbitCluster]:
    """Three nodes joined into one cluster, started once for this file's tests and stopped and removed after
    them (not at the session's end: idle nodes would sit on memory while the rest of the suite runs)."""
    with private_rabbitmq(3, why="the cluster test starts a 3-node cluster from it") as cluster:
        yield cluster


@pytest.fixture
async def cluster_stack(
    rabbit_cluster: RabbitCluster, postgres_dsn: str, redis_url: str, tmp_path: Path
) -> AsyncIterator[Stack]:
    """A stack whose broker is the cluster: its own vhost there, a migrated database, Redis."""
    async with stack_on(rabbit_cluster, postgres_dsn, redis_url, tmp_path) as stack:
        yield stack


class PacedShard:
    """Publishes a stream at a steady rate until told to stop; remembers when each event went out and when
    its first result came back."""

    def __init__(self, shard: Shard, stream: Stream) -> None:
        self.shard = shard
        self.stream = stream
        self.published_at: dict[str, float] = {}
        self.answered_at: dict[str, float] = {}
        self.republished = 0
        self._stop = asyncio.Event()

    async def run(self) -> None:
        tasks: set[asyncio.Task[None]] = set()
        watcher = asyncio.create_task(self._watch())
        try:
            start = time.monotonic()
            for n, body in enumerate(self.stream.bodies):
                if self._stop.is_set():
                    break
                await asyncio.sleep(max(0.0, start + n / RATE - time.monotonic()))
                self.published_at[body["event_id"]] = time.monotonic()
                task = asyncio.create_task(self._publish(body))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            else:
                raise AssertionError("the stream ran out before the faults were over; make it longer")
            await asyncio.gather(*tasks)
        finally:
            watcher.cancel()

    async def _publish(self, body: dict[str, Any]) -> None:
        # A publish the cluster does not confirm (a quorum queue between leaders) is sent again, as a bot
        # would: the event id makes the copy harmless, and the ledger answers it
        for _ in range(20):
            try:
                await self.shard.publish(body)
                return
            except Exception:
                self.republished += 1
                await asyncio.sleep(0.5)
        raise AssertionError(f"event {body['event_id']} could not be published")

    async def _watch(self) -> None:
        while True:
            now = time.monotonic()
            for event_id in list(self.shard.received.results):
                self.answered_at.setdefault(event_id, now)
            await asyncio.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()

    def published(self) -> Stream:
        ids = set(self.published_at)
        return Stream([b for b in self.stream.bodies if b["event_id"] in ids], self.stream.scope_of)

    def answered(self) -> int:
        return len(self.answered_at)

    def outage(self, start: float, end: float) -> tuple[float, float]:
        """What the shard saw of a fault between ``start`` and ``end``: the longest time without any answer,
        and the longest an event published in that window waited for its answer (seconds)."""
        times = sorted(at for at in self.answered_at.values() if start <= at <= end)
        edges = [start, *times, end]
        gap = max(b - a for a, b in itertools.pairwise(edges))
        waits = [
            self.answered_at[e] - at
            for e, at in self.published_at.items()
            if start <= at <= end and e in self.answered_at
        ]
        assert waits, "no event published during the fault was answered"
        return round(gap, 2), round(max(waits), 2)


async def declare_through(node: Node, vhost: str) -> None:
    connection = await aio_pika.connect(node.url(vhost))
    try:
        tiers = RetryPolicy(max_attempts=5, base_delay_ms=200, max_delay_ms=1000).tiers()
        await declare_topology(await connection.channel(), Topology(), tiers)
    finally:
        await connection.close()


async def test_losing_the_workers_node_and_the_queue_leader_loses_and_duplicates_nothing(
    rabbit_cluster: RabbitCluster, cluster_stack: Stack, record_property: Callable[[str, object], None]
) -> None:
    stack, cluster = cluster_stack, rabbit_cluster
    node1, node2, node3 = cluster.nodes
    vhost = stack.rabbitmq_url.rsplit("/", 1)[1]
    await declare_through(node2, vhost)
    assert cluster.leader(vhost, WORK_QUEUE) == node2
    assert cluster.members(vhost, WORK_QUEUE) == sorted(n.name for n in cluster.nodes)  # replicated on all 3

    server_scopes, personal_scopes = await seed_scopes(stack.rows)
    stream = build_stream(6000, server_scopes, personal_scopes, seed=23)
    nodes = ",".join(n.url(vhost) for n in (node1, node3, node2))
    worker = stack.worker(**limit_env(), LTM_RABBITMQ_URL=nodes)
    await worker.wait_for_log("consuming")
    assert consuming_nodes(worker) == [node1.amqp_port]

    figures: dict[str, Any] = {}
    async with Shard(node3.url(vhost)) as shard:
        paced = PacedShard(shard, stream)
        publishing = asyncio.create_task(paced.run())
        try:
            # fault 1: the node the worker consumes through
            await eventually(lambda: paced.answered() >= CALM, "the first answers")
            fault_at = time.monotonic()
            await asyncio.to_thread(cluster.stop_node, node1)
            await worker.wait_for_log("consuming", at_least=2, timeout=60)
            assert consuming_nodes(worker) == [node1.amqp_port, node3.amqp_port]
            await eventually(lambda: _answered_after(paced, fault_at), "an answer after losing node 1")
            await asyncio.to_thread(cluster.start_node, node1)
            figures["node_loss_back_s"] = round(time.monotonic() - fault_at, 2)

            # fault 2: the node that leads the work queue (the worker stays connected to node 3)
            calm_until = paced.answered() + CALM
            await eventually(lambda: paced.answered() >= calm_until, "answers after node 1 came back")
            gap, wait = paced.outage(fault_at, time.monotonic())
            figures["node_loss_no_answer_s"], figures["node_loss_max_wait_s"] = gap, wait
            leader = cluster.leader(vhost, WORK_QUEUE)
            assert leader not in (node3,), f"the work queue's leader moved to {leader.name}, the shard's node"
            fault_at = time.monotonic()
            await asyncio.to_thread(cluster.stop_node, leader)
            await eventually(
                lambda: _answered_after(paced, fault_at), f"an answer after losing {leader.name}"
            )
            new_leader = cluster.leader(vhost, WORK_QUEUE)
            assert new_leader != leader
            await asyncio.to_thread(cluster.start_node, leader)
            figures["leader_loss_back_s"] = round(time.monotonic() - fault_at, 2)
            calm_until = paced.answered() + CALM
            await eventually(lambda: paced.answered() >= calm_until, "answers after the leader came back")
            gap, wait = paced.outage(fault_at, time.monotonic())
            figures["leader_loss_no_answer_s"], figures["leader_loss_max_wait_s"] = gap, wait
        finally:
            paced.stop()
            await publishing
        published = paced.published()
        await wait_for_results(shard, published.event_ids, timeout=120, workers=[worker])
        worker.signal(signal.SIGTERM)
        assert await worker.wait_exit(timeout=30) == 0
        await shard.settle(timeout=30)

    # every event answered, each memory written once, limits exact (answers may repeat: replays)
    statuses = await check_outcome(stack.rows.conn, published, shard.received)
    assert statuses[Status.SAVED] > 0
    copies = sum(len(c) for c in shard.received.results.values())
    figures.update(
        events=len(published),
        answered=len(shard.received.results),
        lost=len(published) - len(shard.received.results),
        duplicated_rows=0,  # check_outcome: one memory row per saved event, none extra
        repeated_results=copies - len(shard.received.results),
        republished=paced.republished,
        leader_after=new_leader.name.split("@")[0],
    )
    for name, value in figures.items():
        record_property(name, value)
    print(f"\nrabbitmq cluster figures: {figures}")


def consuming_nodes(worker: Any) -> list[int]:
    """The AMQP port of the node each ``consuming`` log line names, in order."""
    return [
        int(line["node"].split("@", 1)[1].split("/")[0].rsplit(":", 1)[1])
        for line in worker.lines()
        if line.get("event") == "consuming"
    ]


def _answered_after(paced: PacedShard, fault_at: float) -> bool:
    return any(
        at >= fault_at and event_id in paced.answered_at for event_id, at in paced.published_at.items()
    )
