"""A test's database and vhost are removed when the test fails too; a removal that fails is logged (name and
reason) and never hides the test's own error."""

from __future__ import annotations

import logging
from urllib.parse import unquote, urlsplit

import aio_pika
import asyncpg
import pytest

from tests.services import (
    POSTGRES,
    RABBITMQ,
    Services,
    VhostAdmin,
    _fresh_database,
    _fresh_vhost,
    database_exists,
)

pytestmark = pytest.mark.integration


class BodyFailed(Exception):
    """What the body of a test raises here."""


async def _vhost_answers(url: str) -> bool:
    try:
        connection = await aio_pika.connect(url, timeout=5)
    except Exception:  # the broker refuses a vhost that does not exist
        return False
    await connection.close()
    return True


async def test_a_failing_tests_database_and_vhost_are_removed(test_services: Services) -> None:
    postgres = test_services.resolve(POSTGRES)
    rabbitmq = test_services.resolve(RABBITMQ)
    admin = test_services._admin_for(rabbitmq)
    seen: dict[str, str] = {}

    async def failing_test() -> None:
        async with _fresh_database(postgres) as dsn, _fresh_vhost(rabbitmq, admin) as url:
            seen.update(database=urlsplit(dsn).path[1:], url=url)
            assert await database_exists(postgres.url, seen["database"])
            assert await _vhost_answers(url)
            raise BodyFailed

    with pytest.raises(BodyFailed):
        await failing_test()
    assert not await database_exists(postgres.url, seen["database"])
    assert not await _vhost_answers(seen["url"])


async def test_a_database_that_cannot_be_dropped_is_logged_and_the_tests_error_kept(
    test_services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    postgres = test_services.resolve(POSTGRES)
    seen: dict[str, str] = {}

    async def failing_test() -> None:
        async with _fresh_database(postgres) as dsn:
            seen["database"] = name = urlsplit(dsn).path[1:]
            conn = await asyncpg.connect(postgres.url)
            try:  # Postgres refuses to drop a template database
                await conn.execute(f'ALTER DATABASE "{name}" IS_TEMPLATE true')
            finally:
                await conn.close()
            raise BodyFailed

    try:
        with caplog.at_level(logging.WARNING, logger="tests.services"), pytest.raises(BodyFailed):
            await failing_test()
        name = seen["database"]
        assert await database_exists(postgres.url, name)
        [record] = [r for r in caplog.records if r.name == "tests.services"]
        assert record.levelno == logging.WARNING
        assert f"test database {name} was not dropped" in record.getMessage()
        assert "cannot drop a template database" in record.getMessage()
    finally:
        if "database" in seen:
            conn = await asyncpg.connect(postgres.url)
            try:
                await conn.execute(f'ALTER DATABASE "{seen["database"]}" IS_TEMPLATE false')
                await conn.execute(f'DROP DATABASE IF EXISTS "{seen["database"]}" WITH (FORCE)')
            finally:
                await conn.close()


class RefusesDeletes:
    """The suite's vhost admin, except that deleting fails (as an unreachable management API would)."""

    def __init__(self, admin: VhostAdmin) -> None:
        self.admin = admin

    async def create(self, vhost: str, user: str) -> None:
        await self.admin.create(vhost, user)

    async def delete(self, vhost: str) -> None:
        raise ConnectionRefusedError(111, "Connection refused")


async def test_a_vhost_that_cannot_be_deleted_is_logged_and_the_tests_error_kept(
    test_services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    rabbitmq = test_services.resolve(RABBITMQ)
    admin = test_services._admin_for(rabbitmq)
    seen: dict[str, str] = {}

    async def failing_test() -> None:
        async with _fresh_vhost(rabbitmq, RefusesDeletes(admin)) as url:
            seen["vhost"] = unquote(urlsplit(url).path[1:])
            raise BodyFailed

    try:
        with caplog.at_level(logging.WARNING, logger="tests.services"), pytest.raises(BodyFailed):
            await failing_test()
        [record] = [r for r in caplog.records if r.name == "tests.services"]
        assert record.levelno == logging.WARNING
        refused = "ConnectionRefusedError: [Errno 111] Connection refused"
        assert record.getMessage() == f"test vhost {seen['vhost']} was not deleted: {refused}"
    finally:
        if "vhost" in seen:
            await admin.delete(seen["vhost"])
