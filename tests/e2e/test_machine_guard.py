"""The check that a test run left the machine's services alone (tests/machine_guard.py) notices a Redis
restart and a stopped broker, and reports nothing when nothing happened: shown on servers of the test's own
(a private ``redis-server`` and the session's private RabbitMQ node) standing in for the machine's."""

from __future__ import annotations

import pytest

from tests.e2e.cluster import RabbitCluster, rabbitmq_stopped
from tests.machine_guard import MachineGuard
from tests.support.outages import PrivateRedis

pytestmark = pytest.mark.e2e


def _guard(private_redis: PrivateRedis, private_broker: RabbitCluster, postgres_dsn: str) -> MachineGuard:
    return MachineGuard(
        {
            "LTM_TEST_REDIS_URL": private_redis.url,
            "LTM_TEST_RABBITMQ_URL": private_broker.nodes[0].url(),
            # the machine's Postgres (through the test's database), only looked at
            "LTM_TEST_POSTGRES_DSN": postgres_dsn,
        }
    )


async def test_services_left_alone_give_no_report(
    private_redis: PrivateRedis, private_broker: RabbitCluster, postgres_dsn: str
) -> None:
    guard = _guard(private_redis, private_broker, postgres_dsn)
    await guard.start()
    assert guard.watched == ["Postgres", "RabbitMQ", "Redis"]
    assert await guard.finish() == []


async def test_a_restarted_redis_and_a_stopped_broker_are_reported(
    private_redis: PrivateRedis, private_broker: RabbitCluster, postgres_dsn: str
) -> None:
    guard = _guard(private_redis, private_broker, postgres_dsn)
    await guard.start()
    await private_redis.restart()
    async with rabbitmq_stopped(private_broker):
        pass
    problems = await guard.finish()
    assert len(problems) == 2, problems
    redis, rabbitmq = sorted(problems, reverse=True)
    assert redis.startswith(f"Redis at {private_redis.url}: was run_id "), redis
    assert rabbitmq.startswith(
        f"RabbitMQ at amqp://guest:***@127.0.0.1:{private_broker.nodes[0].amqp_port}/: "
    )
    assert "the connection held since the start of the run was closed" in rabbitmq


async def test_services_elsewhere_or_not_answering_are_left_out(unused_tcp_port: int) -> None:
    guard = MachineGuard(
        {
            "LTM_TEST_REDIS_URL": "redis://redis.example.invalid:6379/0",
            "LTM_TEST_RABBITMQ_URL": f"amqp://guest:guest@127.0.0.1:{unused_tcp_port}/",
            "LTM_TEST_POSTGRES_DSN": f"postgresql://postgres@127.0.0.1:{unused_tcp_port}/postgres",
        }
    )
    await guard.start()
    assert guard.watched == []
    assert await guard.finish() == []
