"""Service fixtures for integration and e2e tests; the machinery lives in tests/services.py.

Nothing here touches Docker or the network until a test requests one of these fixtures.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from tests.services import Services, describe_sources


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Where Postgres, RabbitMQ and Redis come from this run (nothing is started to say it)."""
    return [f"services: {line}" for line in describe_sources()]


@pytest.fixture(scope="session")
def test_services() -> Iterator[Services]:
    """Where Postgres, RabbitMQ and Redis come from this session (env URL, else container, else local).

    Each service is resolved the first time a test needs it; containers started for it stop at session end.
    """
    services = Services()
    try:
        yield services
    finally:
        services.close()


@pytest.fixture
async def postgres_dsn(test_services: Services) -> AsyncIterator[str]:
    """DSN of a fresh, empty database `ltm_test_<hex>`, dropped (WITH (FORCE)) after the test."""
    async with test_services.fresh_database() as dsn:
        yield dsn


@pytest.fixture
async def rabbitmq_url(test_services: Services) -> AsyncIterator[str]:
    """AMQP URL of a fresh vhost `ltm-test-<hex>` (full permissions for the URL's user), deleted after."""
    async with test_services.fresh_vhost() as url:
        yield url


@pytest.fixture
async def redis_url(test_services: Services) -> str:
    """URL of a Redis server that has answered PING.

    Not isolated: keys and pub/sub channels are global to the server and other tests (or sessions) may share
    it, so a test must use unique keys and filter what it receives by event id. Nothing is flushed.
    """
    return await test_services.redis_url()
