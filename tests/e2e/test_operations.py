"""What an operator sees: `worker check`, the probe endpoint and the metrics, against real services."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest

from tests.e2e.stack import Stack
from tests.factories import event_body
from tests.support.harness import REPO, Shard, get, wait_for_metric
from tests.support.proxy import CuttableProxy
from tests.support.wait import eventually
from worker.testing.workers import free_port

pytestmark = pytest.mark.e2e


async def wait_status(port: int, path: str, status: int, timeout: float = 30.0) -> str:
    deadline = asyncio.get_running_loop().time() + timeout
    last: tuple[int, str] | None = None
    while asyncio.get_running_loop().time() < deadline:
        try:
            last = await asyncio.to_thread(get, port, path)
        except OSError:
            last = None
        if last is not None and last[0] == status:
            return last[1]
        await asyncio.sleep(0.2)
    raise AssertionError(f"{path} never answered {status}; last: {last}")


def run_check(stack: Stack, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", "check"],
        cwd=REPO,
        env=stack.env(**env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_check_passes_with_working_dependencies_and_names_a_broken_one(stack: Stack) -> None:
    ok = await asyncio.to_thread(run_check, stack)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "all dependencies work" in ok.stdout
    for name in ("postgres", "rabbitmq", "redis"):
        assert re.search(rf"^ok\s+{name}", ok.stdout, re.M), ok.stdout

    broken = await asyncio.to_thread(run_check, stack, LTM_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    assert broken.returncode == 1
    assert re.search(r"^FAIL\s+redis", broken.stdout, re.M), broken.stdout
    assert "not working: redis" in broken.stdout


@pytest.fixture
async def proxies(stack: Stack) -> AsyncIterator[dict[str, CuttableProxy]]:
    made = {}
    for name, url in (("postgres", stack.postgres_dsn), ("rabbitmq", stack.rabbitmq_url)):
        parts = urlsplit(url)
        made[name] = await CuttableProxy(parts.hostname or "127.0.0.1", parts.port or 0).start()
    try:
        yield made
    finally:
        for proxy in made.values():
            await proxy.close()


async def test_readyz_names_the_dependency_that_is_cut_and_recovers(
    stack: Stack, proxies: dict[str, CuttableProxy]
) -> None:
    port = free_port()
    stack.worker(
        LTM_HTTP_PORT=str(port),
        LTM_POSTGRES_DSN=proxies["postgres"].url(stack.postgres_dsn),
        LTM_RABBITMQ_URL=proxies["rabbitmq"].url(stack.rabbitmq_url),
    )
    await stack.workers_ready()
    assert (await asyncio.to_thread(get, port, "/healthz"))[0] == 200
    await wait_status(port, "/readyz", 200)

    for name, proxy in proxies.items():
        await proxy.cut()
        body = await wait_status(port, "/readyz", 503)
        assert f'"{name}"' in body.split('"checks"')[0], body  # named among the failing ones
        await proxy.restore()
        await wait_status(port, "/readyz", 200, timeout=45)
        assert (await asyncio.to_thread(get, port, "/healthz"))[0] == 200


async def test_metrics_move_with_real_events(stack: Stack) -> None:
    world = await stack.rows.world()
    port = free_port()
    stack.worker(LTM_HTTP_PORT=str(port))
    await stack.workers_ready()
    bodies = [
        event_body(
            {"memory_content": f"fact {i}", "memory_scope": "server_wide"}, persona_id=world.persona_id
        )
        for i in range(3)
    ]
    bad = event_body({"memory_content": 1}, persona_id=world.persona_id)
    async with Shard(stack.rabbitmq_url) as shard:
        for body in [*bodies, bad]:
            await shard.publish(body)
        await shard.publish(b"not json")
        await shard.publish(bodies[0])  # a redelivery: answered from the store
        await shard.wait_for_results([b["event_id"] for b in [*bodies, bad]], timeout=30)
        await eventually(
            lambda: len(shard.received.results[bodies[0]["event_id"]]) == 2, "the second result", 30
        )

    # an event is counted once its ack has gone (acks leave together after a turn), which a shard's result
    # precedes: wait until the five answered events and the dead letter are counted, then read them all
    await wait_for_metric(port, "ltm_event_duration_seconds_count 5.0")
    await wait_for_metric(port, 'ltm_dead_letters_total{kind="malformed"} 1.0')
    _, text = await asyncio.to_thread(get, port, "/metrics")
    samples = dict(re.findall(r"^(ltm_\S+) (\S+)$", text, re.M))
    assert float(samples['ltm_events_total{status="memory_saved_successfully"}']) == 4
    assert float(samples['ltm_events_total{status="memory_save_failed_invalid_args"}']) == 1
    assert float(samples["ltm_replayed_outcomes_total"]) == 1
    assert float(samples['ltm_dead_letters_total{kind="malformed"}']) == 1
    assert float(samples["ltm_event_duration_seconds_count"]) == 5
    assert float(samples["ltm_events_in_flight"]) == 0
    # every answered event went to Postgres in a batch, the redelivery too (its read finds the outcome)
    assert float(samples["ltm_db_batch_size_sum"]) == 5
    assert 1 <= float(samples["ltm_db_batch_size_count"]) <= 5
