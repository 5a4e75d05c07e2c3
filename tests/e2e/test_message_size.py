"""Sizes bounded before memory: a broker with the shipped ``max_message_size`` refuses bodies the contract
forbids, so a flood of 16 MiB bodies never reaches a worker, whose memory stays where its byte budget and one
body of 256 KiB put it. A private single-node broker with the shipped setting (the machine's own broker is
left as it is)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiormq
import pytest

from contracts.models import MAX_BODY_BYTES
from sim.shard import TOOL_ROUTING_KEY
from tests.e2e.cluster import RabbitCluster, private_rabbitmq, stack_on
from tests.e2e.stack import Stack
from tests.factories import event_body
from tests.support.harness import Shard, take_dead_letters

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SHIPPED_CONF = REPO / "deploy" / "rabbitmq" / "rabbitmq.conf"
#: the Deployment's memory limit (deploy/k8s/deployment.yaml)
POD_LIMIT = 512 * 1024 * 1024


def shipped_max_message_size() -> int:
    match = re.search(r"^max_message_size\s*=\s*(\d+)\s*$", SHIPPED_CONF.read_text(), re.MULTILINE)
    assert match, f"{SHIPPED_CONF} sets no max_message_size"
    return int(match.group(1))


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.fixture(scope="module")
def sized_broker() -> Iterator[RabbitCluster]:
    config = f"max_message_size = {shipped_max_message_size()}\n"
    with private_rabbitmq(1, why="this test starts a private node", config=config) as node:
        yield node


@pytest.fixture
async def sized_stack(
    sized_broker: RabbitCluster, postgres_dsn: str, redis_url: str, tmp_path: Path
) -> AsyncIterator[Stack]:
    async with stack_on(sized_broker, postgres_dsn, redis_url, tmp_path) as stack:
        yield stack


def test_the_shipped_limit_is_the_contracts() -> None:
    assert shipped_max_message_size() == MAX_BODY_BYTES


async def test_oversized_bodies_are_refused_by_the_broker_and_never_reach_a_worker(
    sized_stack: Stack,
) -> None:
    stack = sized_stack
    world = await stack.rows.world()
    worker = stack.worker()
    await stack.workers_ready()
    assert worker.proc is not None
    before = peak_rss(worker.proc.pid)

    refused = 0
    connection = await aiormq.connect(stack.rabbitmq_url)
    try:
        channel = await connection.channel()
        for size in [MAX_BODY_BYTES + 1, *[16 * 1024 * 1024] * 24]:
            with pytest.raises(
                aiormq.exceptions.ChannelPreconditionFailed, match="larger than configured max"
            ):
                await channel.basic_publish(
                    b"{" + b" " * (size - 2) + b"}",
                    exchange="tomori.tool_calls",
                    routing_key=TOOL_ROUTING_KEY,
                )
            refused += 1
            channel = await connection.channel()
        # a body of exactly the limit is the worker's to read: over the contract's other bounds, a dead letter
        at_limit = b"[" + b" " * (MAX_BODY_BYTES - 2) + b"]"
        for _ in range(64):
            await channel.basic_publish(at_limit, exchange="tomori.tool_calls", routing_key=TOOL_ROUTING_KEY)
    finally:
        await connection.close()
    assert refused == 25

    good = event_body(
        {"memory_content": "after the flood", "memory_scope": "server_wide"}, persona_id=world.persona_id
    )
    async with Shard(stack.rabbitmq_url) as shard:
        await shard.publish(good)
        await shard.wait_for_results([good["event_id"]], timeout=60)
    letters = await take_dead_letters(stack.rabbitmq_url, 64, timeout=60)
    assert all(len(letter.body) == MAX_BODY_BYTES for letter in letters)
    after = peak_rss(worker.proc.pid)
    print(f"worker peak RSS: {before / 2**20:.0f} MiB before, {after / 2**20:.0f} MiB after the flood")
    assert after < POD_LIMIT
    assert worker.proc.poll() is None
