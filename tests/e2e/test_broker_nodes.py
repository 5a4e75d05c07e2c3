"""LTM_RABBITMQ_URL listing several nodes, one of them down: the commands use the one that answers, report
each, and never show a password. (Losing a node of a real cluster: tests/e2e/test_rabbitmq_cluster.py.)"""

from __future__ import annotations

import asyncio
import json
import re
from urllib.parse import urlsplit, urlunsplit

import pytest

from contracts.models import Status
from tests.e2e.stack import Stack
from tests.factories import event_body
from tests.support.harness import Shard
from worker.testing.workers import free_port

pytestmark = pytest.mark.e2e

SECRET = "n0de-s3cret"


def dead_node(url: str) -> str:
    """``url`` moved to a port nobody listens on, with a password that must never be shown."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"ltm:{SECRET}@127.0.0.1:{free_port()}"))


async def test_check_reports_every_node_and_masks_every_password(stack: Stack) -> None:
    nodes = f"{dead_node(stack.rabbitmq_url)},{stack.rabbitmq_url}"
    done = await asyncio.to_thread(stack.cli, "check", LTM_RABBITMQ_URL=nodes)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output  # the worker runs on the node that answers: the other is a warning
    assert SECRET not in output
    assert re.search(r"^warn\s+rabbitmq\s+amqp://ltm:\*\*\*@127\.0\.0\.1:\d+", output, re.M), output
    assert re.search(r"^ok\s+rabbitmq\s+amqp://", output, re.M), output
    assert len(re.findall(r"^(?:ok|warn|FAIL)\s+rabbitmq", output, re.M)) == 2, output
    assert "1 of 2 RabbitMQ nodes did not answer" in output

    as_json = await asyncio.to_thread(stack.cli, "check", "--json", "--all-nodes", LTM_RABBITMQ_URL=nodes)
    assert as_json.returncode == 1
    assert SECRET not in as_json.stdout + as_json.stderr
    rabbitmq = json.loads(as_json.stdout)["dependencies"]["rabbitmq"]
    assert rabbitmq["ok"] is False  # --all-nodes: ok only when every node is
    assert [node["ok"] for node in rabbitmq["nodes"]] == [False, True]
    assert rabbitmq["problem"].startswith("amqp://ltm:***@127.0.0.1:")


async def test_worker_and_dlq_use_the_node_that_answers(stack: Stack) -> None:
    nodes = f"{dead_node(stack.rabbitmq_url)}, {stack.rabbitmq_url}"
    world = await stack.rows.world()
    process = stack.worker(LTM_RABBITMQ_URL=nodes)
    await process.wait_for_log("consuming")
    [consuming] = [line for line in process.lines() if line.get("event") == "consuming"]
    assert consuming["node"].endswith(urlsplit(stack.rabbitmq_url).path)
    assert SECRET not in process.log_path.read_text()

    event = event_body(
        {"memory_content": "likes failover", "memory_scope": "server_wide"}, persona_id=world.persona_id
    )
    async with Shard(stack.rabbitmq_url) as shard:
        await shard.publish(event)
        await shard.wait_for_results([event["event_id"]], timeout=30)
    [result] = shard.received.results[event["event_id"]]
    assert result["status"] == Status.SAVED

    listed = await asyncio.to_thread(stack.cli, "dlq", "list", LTM_RABBITMQ_URL=nodes)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "0 of 0 dead letters" in listed.stderr  # it reached the broker through the second node
    assert SECRET not in listed.stdout + listed.stderr
    unreachable = await asyncio.to_thread(
        stack.cli,
        "dlq",
        "list",
        LTM_RABBITMQ_URL=f"{dead_node(stack.rabbitmq_url)},{dead_node(stack.rabbitmq_url)}",
    )
    assert unreachable.returncode == 3, unreachable.stdout + unreachable.stderr
    assert SECRET not in unreachable.stdout + unreachable.stderr
    assert "no RabbitMQ node answered" in unreachable.stdout + unreachable.stderr
