"""Security review 5, N-E: a shard re-declares its own results queue to dead-letter into another shard's queue
(``x-dead-letter-exchange: tomori.tool_calls`` with shard 1's routing key, which RabbitMQ takes: it checks
write on the exchange, not the topic permission of the key). ``worker check --management-url`` now fails on
it, naming the queue and its arguments; without the management API the check says it skipped that (AMQP
cannot read a queue's arguments). And security review 5, N-G: a mistyped identity setting fails the check.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import pytest

from tests.integration.test_cli import worker
from tests.services import ManagementApi, Services
from tests.support.users import Grants, Users, rabbitmq_users
from worker.broker.topology import declare_topology
from worker.config import Topology, env_of

pytestmark = pytest.mark.integration

TOPOLOGY = Topology()
#: the review's trick: everything that reaches shard 0's results queue expires at once into shard 1's queue
LAUNDERING = {
    "x-dead-letter-exchange": "tomori.tool_calls",
    "x-dead-letter-routing-key": "tool.create_long_term_memory.shard.1",
    "x-message-ttl": 0,
}


@pytest.fixture
def services(migrated_dsn: str, rabbitmq_url: str, redis_url: str) -> dict[str, str]:
    return env_of(postgres_dsn=migrated_dsn, rabbitmq_url=rabbitmq_url, redis_url=redis_url)


@pytest.fixture
async def shard_0(test_services: Services, rabbitmq_url: str) -> AsyncIterator[Users]:
    async with rabbitmq_users(test_services, rabbitmq_url, {"shard-0": Grants.shard(0)}) as made:
        yield made


def management_url(test_services: Services) -> str:
    """The session's management API, its administrator in the URL; a broker without one skips the test (and
    fails it under CI, whose local broker has the plugin enabled)."""
    admin = test_services.broker_admin()
    if not isinstance(admin, ManagementApi):
        if os.environ.get("CI"):
            pytest.fail("the test broker has no management API (rabbitmq-plugins enable rabbitmq_management)")
        pytest.skip("the test broker has no management API (rabbitmq-plugins enable rabbitmq_management)")
    parts = urlsplit(admin.base_url)
    return urlunsplit(parts._replace(netloc=f"{admin.user}:{admin.password}@{parts.netloc}"))


async def test_check_fails_on_a_shard_queue_that_dead_letters_into_another_shards_queue(
    services: dict[str, str], rabbitmq_url: str, shard_0: Users, test_services: Services
) -> None:
    api = management_url(test_services)
    admin = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await admin.channel()
        declared = await declare_topology(channel, TOPOLOGY, [1000])
        for shard_id in (0, 1):  # both shards' queues as the contract has them
            queue = await channel.declare_queue(f"tomori.shard.{shard_id}.results", durable=True)
            await queue.bind(declared.results, f"shard.{shard_id}")
    finally:
        await admin.close()
    clean = worker("check", "--management-url", api, **services)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "2 shard queue(s) in vhost" in clean.stdout
    assert "none with dead-letter arguments" in clean.stdout

    # shard 0, as its own user and within its grants: its queue deleted, declared again dead-lettering onward
    shard = await aio_pika.connect(shard_0.url("shard-0"))
    try:
        channel = await shard.channel()
        await channel.queue_delete("tomori.shard.0.results")
        queue = await channel.declare_queue("tomori.shard.0.results", durable=True, arguments=LAUNDERING)
        await queue.bind(TOPOLOGY.results_exchange, "shard.0")
    finally:
        await shard.close()

    done = worker("check", "--management-url", api, **services)
    assert done.returncode == 1, done.stdout + done.stderr
    [fail] = re.findall(r"^FAIL  shard queues (\S+)\n      (.*)$", done.stdout, re.M)
    target, detail = fail
    assert ":***@" in target  # the management URL's password is never shown
    assert detail.startswith(
        "tomori.shard.0.results has x-dead-letter-exchange='tomori.tool_calls', "
        "x-dead-letter-routing-key='tool.create_long_term_memory.shard.1': its messages go on elsewhere"
    )
    assert "tomori.shard.1.results" not in detail
    assert done.stdout.splitlines()[-1] == "not working: shard queues"


async def test_without_the_management_api_check_says_it_skipped_the_shard_queues(
    services: dict[str, str],
) -> None:
    done = worker("check", **services)

    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "skip  shard queues\n      not checked for dead-letter arguments: AMQP cannot read a queue's "
        "arguments, only RabbitMQ's management API can (give --management-url"
    ) in done.stdout
    assert done.stdout.splitlines()[-1] == "all dependencies work"


async def test_check_fails_on_a_mistyped_identity_setting(services: dict[str, str]) -> None:
    """Security review 5, N-G: the worker would not start on it, so the check does not pass."""
    done = worker("check", **services, LTM_SHARD_IDENTITY="requried")

    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "FAIL  setting   LTM_SHARD_IDENTITY\n      LTM_SHARD_IDENTITY='requried' is not one of checked, "
        "required, shared; refused"
    ) in done.stdout
    assert "warn  LTM_SHARD_IDENTITY" not in done.stdout  # not a fallback
    assert done.stdout.splitlines()[-1] == "not working: setting"
