"""RabbitMQ blocks the worker's connection (a memory alarm) for 12 s under load, on a private one-node
broker (tests/e2e/cluster.py; the machine's broker is never alarmed). The worker under test starts during
the alarm with a backlog in its queue, so it holds a full prefetch of events whose results the broker
holds back, however fast the machine is.

What must hold: a WARNING line when the block starts and one when it ends, ``ltm_rabbitmq_blocked`` 1 during
the block and 0 after, ``/readyz`` naming the block, and no event answered twice: a result publish the
broker holds back is not a publish that failed, so no retry copy is made for it (before the fix each result
held longer than 10 s timed out, its event was retried, and the shard got the held result and the retry's).
"""

from __future__ import annotations

import asyncio
import signal
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from contracts.models import Status
from tests.e2e.cluster import Node, RabbitCluster, stack_on
from tests.e2e.stack import Stack
from tests.e2e.workload import Stream, build_stream, check_outcome, limit_env, seed_scopes, wait_for_results
from tests.support.harness import Shard
from tests.support.wait import eventually
from worker.broker.publisher import PUBLISH_TIMEOUT
from worker.testing.workers import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: events per second the shard offers around the alarm (its own publishes are held during it too)
RATE = 100
#: events waiting in the queue when the worker under test starts, during the alarm: a full prefetch and more
BURST = 400
#: how long the alarm lasts once the worker under test consumes: its results are held longer than the
#: worker's publish timeout, which is what this test is about (the alarm itself lasts a few seconds more,
#: the worker's start-up); not a wait for something to happen, which the test never does by the clock
HELD_SECONDS = PUBLISH_TIMEOUT + 2.0
SET_ALARM = "rabbit_alarm:set_alarm({{resource_limit, memory, node()}, []})."
CLEAR_ALARM = "rabbit_alarm:clear_alarm({resource_limit, memory, node()})."


@pytest.fixture
def rabbit_node(private_broker: RabbitCluster) -> tuple[RabbitCluster, Node]:
    """The session's private one-node broker (tests/e2e/conftest.py), shared with the outage tests."""
    return private_broker, private_broker.nodes[0]


@pytest.fixture
async def alarm_stack(
    rabbit_node: tuple[RabbitCluster, Node], postgres_dsn: str, redis_url: str, tmp_path: Path
) -> AsyncIterator[Stack]:
    cluster, node = rabbit_node
    try:
        async with stack_on(cluster, postgres_dsn, redis_url, tmp_path) as stack:
            yield stack
    finally:
        # whatever happened, the node is left without an alarm
        await asyncio.to_thread(_ctl_quietly, cluster, node, "eval", CLEAR_ALARM)


def _ctl_quietly(cluster: RabbitCluster, node: Node, *args: str) -> None:
    try:
        cluster.ctl(node, *args)
    except Exception as exc:  # the node may be gone already
        print(f"rabbitmqctl {' '.join(args)}: {exc}")


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:  # not listening yet
        return 0, str(exc)


def _gauge(metrics: str) -> float | None:
    for line in metrics.splitlines():
        if line.startswith("ltm_rabbitmq_blocked "):
            return float(line.split()[1])
    return None


class Sampler:
    """Polls /readyz and /metrics every 200 ms and keeps what it saw."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.samples: list[tuple[float, float | None, int, str]] = []
        self._stop = asyncio.Event()

    async def run(self) -> None:
        while not self._stop.is_set():
            _, metrics = await asyncio.to_thread(_get, self.port, "/metrics")
            status, ready = await asyncio.to_thread(_get, self.port, "/readyz")
            self.samples.append((time.monotonic(), _gauge(metrics), status, ready))
            await asyncio.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()


async def test_a_memory_alarm_is_visible_and_answers_nothing_twice(
    rabbit_node: tuple[RabbitCluster, Node], alarm_stack: Stack
) -> None:
    cluster, node = rabbit_node
    stack = alarm_stack
    server_scopes, personal_scopes = await seed_scopes(stack.rows)
    stream = build_stream(BURST + int(RATE * 20), server_scopes, personal_scopes, seed=31)
    burst, paced = stream.bodies[:BURST], stream.bodies[BURST:]
    port = free_port()
    figures: dict[str, Any] = {}
    async with Shard(stack.rabbitmq_url) as shard:
        publishing: set[asyncio.Task[None]] = set()
        sent: set[str] = set()

        async def offer(bodies: list[dict[str, Any]], seconds: float) -> None:
            start = time.monotonic()
            for n, body in enumerate(bodies):
                if time.monotonic() - start > seconds:
                    return
                await asyncio.sleep(max(0.0, start + n / RATE - time.monotonic()))
                sent.add(body["event_id"])
                publishing.add(asyncio.create_task(shard.publish(body)))

        # events flow: a first worker declares the topology and answers a paced stream, then stops
        first = stack.worker(**limit_env())
        await first.wait_for_log("consuming")
        await offer(paced[:200], 2.0)
        await asyncio.gather(*publishing)
        await wait_for_results(shard, sorted(sent), timeout=60, workers=[first])
        first.signal(signal.SIGTERM)
        assert await first.wait_exit(timeout=60) == 0
        # a backlog, then the alarm, then the worker under test: it takes a full prefetch of events whose
        # results the broker holds back (whatever the machine's speed: nothing drains the backlog before)
        sent.update(body["event_id"] for body in burst)
        await shard.publish_many(burst)
        try:
            alarm_at = time.monotonic()
            await asyncio.to_thread(cluster.ctl, node, "eval", SET_ALARM)
            worker = stack.worker(**limit_env(), LTM_HTTP_PORT=str(port))
            await worker.wait_for_log("consuming")
            consuming_at = time.monotonic()
            sampler = Sampler(port)
            sampling = asyncio.create_task(sampler.run())
            during = asyncio.create_task(offer(paced[200:], HELD_SECONDS))
            await asyncio.sleep(max(0.0, consuming_at + HELD_SECONDS - time.monotonic()))
            await asyncio.to_thread(cluster.ctl, node, "eval", CLEAR_ALARM)
            cleared_at = time.monotonic()
            await during
            await asyncio.gather(*publishing)
        finally:
            await asyncio.to_thread(_ctl_quietly, cluster, node, "eval", CLEAR_ALARM)
        published = Stream([b for b in stream.bodies if b["event_id"] in sent], stream.scope_of)
        await wait_for_results(shard, published.event_ids, timeout=180, workers=[worker])
        # the gauge and /readyz once the block is over: 0 and ready (asserted below on the last sample)
        await eventually(
            lambda: sampler.samples and sampler.samples[-1][1] == 0 and sampler.samples[-1][2] == 200,
            "ltm_rabbitmq_blocked 0 and /readyz 200 after the block",
            30,
        )
        sampler.stop()
        await sampling
        await shard.settle(timeout=30)

    copies = sum(len(c) for c in shard.received.results.values())
    blocked_lines = [
        line for line in worker.lines() if line.get("event") == "rabbitmq blocked the connection"
    ]
    unblocked_lines = [
        line for line in worker.lines() if line.get("event") == "rabbitmq unblocked the connection"
    ]
    figures.update(
        events=len(published),
        answered=len(shard.received.results),
        answered_twice=sum(1 for c in shard.received.results.values() if len(c) > 1),
        extra_results=copies - len(shard.received.results),
        retries=worker.count("transient fault; retrying later")
        + first.count("transient fault; retrying later"),
        unrouted=worker.count("could not route a failed event; it will be redelivered"),
        alarm_s=round(cleared_at - alarm_at, 1),
        blocked_samples=sum(1 for s in sampler.samples if s[1] == 1),
    )
    print(f"\nrabbitmq alarm figures: {figures}")

    statuses = await check_outcome(stack.rows.conn, published, shard.received)
    assert statuses[Status.SAVED] > 0
    # visible: a WARNING at the start and at the end
    assert [line["level"] for line in blocked_lines] == ["warning"], blocked_lines
    assert "memory" in str(blocked_lines[0].get("reason", "")).lower(), blocked_lines
    assert [line["level"] for line in unblocked_lines] == ["warning"], unblocked_lines
    # the gauge 1 during the block, /readyz not ready naming it; 0 and ready after
    # a sample reads /metrics, then /readyz: at the block's edges the two may straddle its start or its end,
    # so /readyz is judged on the samples inside the block (the gauge 1 in the one before and after too)
    samples = sampler.samples
    assert any(s[1] == 1 for s in samples), f"ltm_rabbitmq_blocked never read 1: {samples[:5]}"
    held = [
        s
        for before, s, after in zip(samples, samples[1:], samples[2:], strict=False)
        if before[1] == s[1] == after[1] == 1
    ]
    assert held, f"ltm_rabbitmq_blocked read 1 in no three samples in a row: {samples}"
    assert all(status == 503 and "blocked" in ready for _, _, status, ready in held), held[:3]
    last = sampler.samples[-1]
    assert last[1] == 0, last
    assert last[2] == 200, last
    # nothing answered twice, nothing retried because of the block
    assert figures["answered_twice"] == 0, figures
    assert figures["retries"] == 0, figures
