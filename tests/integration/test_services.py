"""The service fixtures work and isolate tests from each other; and resolution is lazy and ordered."""

from __future__ import annotations

from collections.abc import Callable

import aio_pika
import asyncpg
import pytest
import redis.asyncio as aioredis

from tests.services import (
    POSTGRES,
    RABBITMQ,
    REDIS,
    Endpoint,
    Services,
    StartedService,
    database_exists,
    redact,
    run_async,
    with_path,
)

USER_TABLES = "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"


@pytest.mark.integration
async def test_postgres_databases_are_distinct_empty_and_dropped(
    postgres_dsn: str, test_services: Services
) -> None:
    first = await asyncpg.connect(postgres_dsn)
    try:
        async with test_services.fresh_database() as other_dsn:
            assert other_dsn != postgres_dsn
            # left open across the drop on purpose: WITH (FORCE) must not wait for a test's connections
            second = await asyncpg.connect(other_dsn)
            name = await first.fetchval("SELECT current_database()")
            other_name = await second.fetchval("SELECT current_database()")
            assert name != other_name
            assert name.startswith("ltm_test_")
            assert other_name.startswith("ltm_test_")
            assert await first.fetchval(USER_TABLES) == 0
            assert await second.fetchval(USER_TABLES) == 0

            await first.execute("CREATE TABLE only_here (id int)")
            assert await first.fetchval(USER_TABLES) == 1
            assert await second.fetchval(USER_TABLES) == 0
        second.terminate()
    finally:
        await first.close()

    admin_dsn = test_services.resolve(POSTGRES).url
    assert not await database_exists(admin_dsn, other_name)


async def _connect_and_close(url: str) -> None:
    connection = await aio_pika.connect(url, timeout=5)
    await connection.close()


@pytest.mark.integration
async def test_a_message_in_one_vhost_is_not_visible_from_another(
    rabbitmq_url: str, test_services: Services
) -> None:
    queue_name = "ltm.test.isolation"
    async with test_services.fresh_vhost() as other_url:
        assert other_url != rabbitmq_url
        sender = await aio_pika.connect(rabbitmq_url)
        other = await aio_pika.connect(other_url)
        try:
            sending = await sender.channel()
            await sending.declare_queue(queue_name)
            await sending.default_exchange.publish(
                aio_pika.Message(b"only in the first vhost"), routing_key=queue_name
            )

            looking = await other.channel()
            mirror = await looking.declare_queue(queue_name)
            assert await mirror.get(fail=False, timeout=2) is None

            original = await sending.get_queue(queue_name)
            message = await original.get(fail=False, timeout=5)
            assert message is not None
            assert message.body == b"only in the first vhost"
            await message.ack()
        finally:
            await sender.close()
            await other.close()

    # the vhost is gone after the context: connecting to it is refused
    with pytest.raises(aio_pika.exceptions.AMQPError):
        await _connect_and_close(other_url)


@pytest.mark.integration
async def test_redis_answers_ping(redis_url: str) -> None:
    client = aioredis.from_url(redis_url)
    try:
        assert await client.ping() is True
    finally:
        await client.aclose()


# The tests below need no service: they check the resolution order and that it stays lazy.


def _services(environ: dict[str, str], docker: bool, calls: list[str]) -> Services:
    def probe() -> bool:
        calls.append("docker ping")
        return docker

    def starter(name: str) -> Callable[[], StartedService]:
        def start() -> StartedService:
            calls.append(f"start {name}")
            return StartedService(url=f"{name}://container", stop=lambda: calls.append(f"stop {name}"))

        return start

    return Services(
        environ=environ,
        docker_reachable=probe,
        starters={spec.name: starter(spec.name) for spec in (POSTGRES, RABBITMQ, REDIS)},
    )


def test_environment_urls_win_and_skip_docker() -> None:
    calls: list[str] = []
    services = _services({"LTM_TEST_POSTGRES_DSN": "postgresql://u:p@db:5432/x"}, True, calls)
    assert services.resolve(POSTGRES) == Endpoint(POSTGRES, "postgresql://u:p@db:5432/x", "env")
    assert calls == []


def test_containers_when_docker_answers_once_per_service_and_stopped_at_close() -> None:
    calls: list[str] = []
    services = _services({"LTM_TEST_REDIS_URL": "redis://elsewhere:6379/0"}, True, calls)
    assert services.resolve(RABBITMQ).origin == "container"
    assert services.resolve(RABBITMQ).url == "RabbitMQ://container"
    assert services.resolve(REDIS).origin == "env"
    assert services.resolve(POSTGRES).origin == "container"
    services.close()
    assert calls == ["docker ping", "start RabbitMQ", "start Postgres", "stop Postgres", "stop RabbitMQ"]


def test_local_defaults_without_docker() -> None:
    calls: list[str] = []
    services = _services({}, False, calls)
    assert [services.resolve(spec).url for spec in (POSTGRES, RABBITMQ, REDIS)] == [
        "postgresql://postgres@127.0.0.1:5432/postgres",
        "amqp://guest:guest@127.0.0.1:5672/",
        "redis://127.0.0.1:6379/0",
    ]
    assert calls == ["docker ping"]


def test_unreachable_message_names_service_url_and_remedy() -> None:
    message = str(Endpoint(RABBITMQ, "amqp://guest:secret@10.0.0.9:5672/", "local").unavailable("refused"))
    assert "RabbitMQ" in message
    assert "amqp://guest:***@10.0.0.9:5672/" in message
    assert "secret" not in message
    assert "LTM_TEST_RABBITMQ_URL" in message
    assert "rabbitmq-server -detached" in message


def test_url_helpers() -> None:
    assert redact("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert with_path("postgresql://u:p@h:5/postgres?sslmode=disable", "/ltm_test_ab") == (
        "postgresql://u:p@h:5/ltm_test_ab?sslmode=disable"
    )


async def _answer() -> int:
    return 42


async def test_run_async_works_inside_a_running_loop() -> None:
    assert run_async(_answer()) == 42


def test_run_async_works_without_a_loop() -> None:
    assert run_async(_answer()) == 42
