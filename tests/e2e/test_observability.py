"""What an operations team watches, on a live worker: the metrics the dashboard and the alert rules use,
queue depths sampled from the broker, and dependency state kept current without anyone calling /readyz."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from urllib.parse import urlsplit

import pytest

from tests.e2e.stack import Stack
from tests.factories import event_body
from tests.monitoring import exposed_names, metric_names_used
from tests.support.harness import Shard, get, metric, wait_for_metric
from tests.support.proxy import CuttableProxy
from worker.broker.topology import retry_queue_name
from worker.config import Topology, load_settings
from worker.service.policy import RetryPolicy
from worker.testing.workers import free_port

pytestmark = pytest.mark.e2e

DLQ = Topology().dead_letter_queue
WORK = Topology().work_queue


def fresh(body: dict[str, object]) -> dict[str, object]:
    """The event as a shard publishes it now (the factories' issued_at is a fixed day)."""
    return {**body, "issued_at": datetime.now(UTC).isoformat().replace("+00:00", "Z")}


async def test_every_metric_the_dashboard_and_the_alerts_use_exists_after_real_events(stack: Stack) -> None:
    world = await stack.rows.world()
    port = free_port()
    env = stack.env(LTM_HTTP_PORT=str(port), LTM_METRICS_INTERVAL_SECONDS="1")
    stack.worker(LTM_HTTP_PORT=str(port), LTM_METRICS_INTERVAL_SECONDS="1")
    await stack.workers_ready()
    saves = [
        fresh(
            event_body(
                {"memory_content": f"fact {i}", "memory_scope": "server_wide"}, persona_id=world.persona_id
            )
        )
        for i in range(3)
    ]
    bad_arguments = fresh(event_body({"memory_content": 1}, persona_id=world.persona_id))
    async with Shard(stack.rabbitmq_url) as shard:
        for body in [*saves, bad_arguments]:
            await shard.publish(body)
        await shard.publish(b"not json")  # dead-lettered at once: the DLQ holds one
        await shard.wait_for_results([str(b["event_id"]) for b in [*saves, bad_arguments]], timeout=30)

    await wait_for_metric(port, f'ltm_queue_messages{{queue="{DLQ}"}} 1.0')
    # an event is counted once its ack has gone, after its result: wait for the four
    await wait_for_metric(port, "ltm_event_age_seconds_count 4.0")
    # the shard's first event gave it a queue of its own (recorded in Postgres): the sampler reports its depth
    shard = saves[0]["shard_id"]
    await wait_for_metric(port, f'ltm_shard_events_queued{{shard="{shard}"}} 0.0')
    _, text = await asyncio.to_thread(get, port, "/metrics")
    exposed = exposed_names(text)
    missing = {name: where for name, where in metric_names_used().items() if name not in exposed}
    assert not missing, f"used by deploy/ but not on a live worker's /metrics: {missing}"

    # the sampler saw every queue the worker declared; one consumer (this worker) on the work queue
    settings = load_settings(env)
    delays = RetryPolicy.of(settings).tiers()
    for queue in [retry_queue_name(settings.topology, delay) for delay in delays]:
        assert await metric(port, f'ltm_queue_messages{{queue="{queue}"}}') == 0
    assert await metric(port, f'ltm_queue_consumers{{queue="{WORK}"}}') == 1
    # four events were answered, each on its first trip through the queue; the unreadable one has no age
    assert await metric(port, "ltm_event_age_seconds_count") == 4
    assert await metric(port, "ltm_queue_wait_seconds_count") == 4
    assert await metric(port, 'ltm_event_age_seconds_bucket{le="60.0"}') == 4
    # nothing called /readyz, yet every dependency is known to be up
    for dependency in ("postgres", "redis", "rabbitmq"):
        assert await metric(port, f'ltm_dependency_up{{dependency="{dependency}"}}') == 1
    assert "ltm_build_info{" in text
    assert await metric(port, 'ltm_dead_letters_total{kind="malformed"}') == 1


@pytest.fixture
async def redis_proxy(stack: Stack) -> AsyncIterator[CuttableProxy]:
    parts = urlsplit(stack.redis_url)
    proxy = await CuttableProxy(parts.hostname or "127.0.0.1", parts.port or 6379).start()
    try:
        yield proxy
    finally:
        await proxy.close()


async def test_dependency_state_follows_an_outage_without_readyz(
    stack: Stack, redis_proxy: CuttableProxy
) -> None:
    port = free_port()
    stack.worker(
        LTM_HTTP_PORT=str(port),
        LTM_METRICS_INTERVAL_SECONDS="1",
        LTM_REDIS_URL=redis_proxy.url(stack.redis_url),
    )
    await stack.workers_ready()
    await wait_for_metric(port, 'ltm_dependency_up{dependency="redis"} 1.0')
    await redis_proxy.cut()
    await wait_for_metric(port, 'ltm_dependency_up{dependency="redis"} 0.0')
    assert await metric(port, 'ltm_dependency_up{dependency="postgres"}') == 1
    await redis_proxy.restore()
    await wait_for_metric(port, 'ltm_dependency_up{dependency="redis"} 1.0')
