"""What a routine connection loss leaves in a worker's log: warnings, never an ERROR an alert would page on.

No service is stopped here (other tests share them): one case has RabbitMQ close the worker's connection
itself (`rabbitmqctl close_connection`, the same Connection.Close 320 a restart sends); the others put a
dependency behind a proxy that drops its connections and refuses new ones for a while.
"""

from __future__ import annotations

import shutil
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.e2e.stack import Stack
from tests.factories import event_body
from tests.services import is_this_machine
from tests.support.commands import run_command
from tests.support.harness import Shard, WorkerProcess
from tests.support.proxy import CuttableProxy
from worker.testing.workers import free_port

pytestmark = pytest.mark.e2e


def errors(worker: WorkerProcess) -> list[dict[str, Any]]:
    return [line for line in worker.lines() if line.get("level") in ("error", "critical")]


async def consumes(stack: Stack, timeout: float = 30.0) -> None:
    """An event published now is answered: the worker consumes again."""
    world = await stack.rows.world()
    body = event_body(
        {"memory_content": "still here", "memory_scope": "server_wide"}, persona_id=world.persona_id
    )
    async with Shard(stack.rabbitmq_url) as shard:
        await shard.publish(body)
        await shard.wait_for_results([body["event_id"]], timeout=timeout)
        assert shard.received.results[body["event_id"]][0]["success"] is True


async def worker_connections(ctl: str, vhost: str) -> list[str]:
    code, text = await run_command(
        ctl, "list_connections", "pid", "vhost", "--quiet", "--no-table-headers", timeout=60
    )
    assert code == 0, text
    return [row.split("\t")[0] for row in text.splitlines() if row.endswith(f"\t{vhost}")]


async def test_a_connection_the_broker_closes_is_logged_as_a_warning(stack: Stack) -> None:
    parts = urlsplit(stack.rabbitmq_url)
    ctl = shutil.which("rabbitmqctl")
    if ctl is None or not is_this_machine(parts.hostname or ""):
        pytest.skip("needs rabbitmqctl on the broker's machine to close a connection")
    vhost = parts.path[1:]
    worker = stack.worker()
    await worker.wait_for_log("consuming")
    (connection,) = await worker_connections(ctl, vhost)

    code, text = await run_command(ctl, "close_connection", connection, "planned restart", timeout=60)
    assert code == 0, text
    await worker.wait_for_log("rabbitmq connection lost; reconnecting")
    await worker.wait_for_log("consuming", at_least=2)
    await consumes(stack)

    assert errors(worker) == []
    closes = [
        line
        for line in worker.lines()
        if str(line.get("event", "")).startswith("Unexpected connection close")
    ]
    # aiormq's own line stays, with the broker's reason, one level down: the filter recognised it
    assert [(line["level"], line["logger"]) for line in closes] == [("warning", "aiormq.connection")], closes
    assert "CONNECTION_FORCED - planned restart" in closes[0]["event"]
    assert not any("Cancelling cause reader exited abnormally" in str(line) for line in worker.lines())


async def test_a_broker_that_drops_and_refuses_connections_leaves_no_error(stack: Stack) -> None:
    parts = urlsplit(stack.rabbitmq_url)
    proxy = await CuttableProxy(parts.hostname or "127.0.0.1", parts.port or 5672).start()
    try:
        # the probe port on, so the metrics sampler's own connections meet the outage too
        worker = stack.worker(
            LTM_RABBITMQ_URL=proxy.url(stack.rabbitmq_url),
            LTM_HTTP_PORT=str(free_port()),
            LTM_METRICS_INTERVAL_SECONDS="1",
        )
        await worker.wait_for_log("consuming")

        await proxy.cut()
        await worker.wait_for_log("rabbitmq connection lost; reconnecting")
        await worker.wait_for_log("rabbitmq unavailable", at_least=2)  # refused reconnects, with backoff
        await proxy.restore()
        await worker.wait_for_log("consuming", at_least=2, timeout=45)
        await consumes(stack)
    finally:
        await proxy.close()

    assert errors(worker) == []
    unavailable = [line for line in worker.lines() if line.get("event") == "rabbitmq unavailable"]
    assert all("Connection refused" in line["error"] for line in unavailable), unavailable
    # the reader task's traceback for the dropped socket is gone (it says no more than the worker's line)
    assert not any("Cancelling cause reader exited abnormally" in str(line) for line in worker.lines())


@pytest.mark.parametrize(
    ("cut", "noticed", "recovered"),
    [
        ("postgres", "transient fault; retrying later", "event processed"),
        (
            "redis",
            "redis unavailable; invalidations are kept in postgres until it answers",
            "redis answers again; pending invalidations published",
        ),
    ],
)
async def test_postgres_or_redis_cut_mid_event_leaves_no_error(
    stack: Stack, cut: str, noticed: str, recovered: str
) -> None:
    """asyncpg and redis-py log no ERROR for a lost connection (asyncpg: one WARNING from its pool)."""
    proxies = {}
    for name, url in (("postgres", stack.postgres_dsn), ("redis", stack.redis_url)):
        parts = urlsplit(url)
        proxies[name] = await CuttableProxy(parts.hostname or "127.0.0.1", parts.port or 0).start()
    world = await stack.rows.world()
    body = event_body(
        {"memory_content": "through the cut", "memory_scope": "server_wide"}, persona_id=world.persona_id
    )
    try:
        worker = stack.worker(
            LTM_POSTGRES_DSN=proxies["postgres"].url(stack.postgres_dsn),
            LTM_REDIS_URL=proxies["redis"].url(stack.redis_url),
        )
        await worker.wait_for_log("consuming")
        async with Shard(stack.rabbitmq_url) as shard:
            await proxies[cut].cut()
            await shard.publish(body)
            await worker.wait_for_log(noticed)  # the client library met the cut
            await proxies[cut].restore()
            await worker.wait_for_log(recovered, timeout=45)
            await shard.wait_for_results([body["event_id"]])
            assert shard.received.results[body["event_id"]][-1]["success"] is True
    finally:
        for proxy in proxies.values():
            await proxy.close()

    assert errors(worker) == []
