"""Postgres, RabbitMQ and Redis in containers (testcontainers), with a bounded start and readiness that means
ready: a query answered, an AMQP connection and the management API, PING.

Images come from worker/testing/images.py (official, pinned; `LTM_*_IMAGE` overrides each). How one
container is started, bounded (`LTM_CONTAINER_START_TIMEOUT`) and cleaned up (Ryuk, or
`TESTCONTAINERS_RYUK_DISABLED=true`) is worker/testing/engine.py, where its ports are published
(`LTM_STACK_PUBLISH_ADDRESS`) worker/testing/ports.py; their public names are importable from here too.
testcontainers is imported only when a container is started, so this module imports without it (install the
`testing` extra).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import quote

from worker.testing.engine import (
    DEFAULT_START_TIMEOUT,
    LABEL,
    OWNER_LABEL,
    PROBE_TIMEOUT,
    START_TIMEOUT_ENV,
    Container,
    ContainerError,
    Deadline,
    StartAbandoned,
    run_blocking,
    seconds_from_env,
    start_timeout,
    started,
)
from worker.testing.images import POSTGRES, RABBITMQ, REDIS
from worker.testing.management import ManagementApi
from worker.testing.ports import PUBLISH_ADDRESS_ENV, bound_address, publish_address

__all__ = [
    "DEFAULT_START_TIMEOUT",
    "LABEL",
    "OWNER_LABEL",
    "PUBLISH_ADDRESS_ENV",
    "START_TIMEOUT_ENV",
    "Container",
    "ContainerError",
    "Deadline",
    "PostgresServer",
    "RabbitmqServer",
    "RedisServer",
    "StartAbandoned",
    "bound_address",
    "publish_address",
    "redis_command",
    "run_blocking",
    "seconds_from_env",
    "start_postgres",
    "start_rabbitmq",
    "start_redis",
    "start_timeout",
]


@dataclass
class PostgresServer:
    """A Postgres container; `dsn` is its superuser's, on `database`."""

    container: Container
    dsn: str

    def stop(self) -> None:
        self.container.stop()


def start_postgres(
    deadline: Deadline, *, database: str = "postgres", environ: Mapping[str, str] | None = None
) -> PostgresServer:
    """Postgres, ready once a query over TCP is answered (the official image's first-start initialisation
    runs a server without TCP, and logs "ready to accept connections" for it too)."""
    import asyncpg

    password = secrets.token_hex(12)
    env = {"POSTGRES_USER": "postgres", "POSTGRES_PASSWORD": password, "POSTGRES_DB": database}
    dsns: list[str] = []

    def ready(container: Container) -> Callable[[], object]:
        async def query() -> None:
            connection = await asyncpg.connect(dsns[0], timeout=PROBE_TIMEOUT)
            try:
                await connection.fetchval("SELECT 1")
            finally:
                await connection.close()

        def probe() -> None:
            if not dsns:
                address = container.address(5432)
                dsns.append(f"postgresql://postgres:{password}@{address}/{quote(database, safe='')}")
            run_blocking(query())

        return probe

    container = started(POSTGRES, (5432,), env, deadline, environ, ready)
    return PostgresServer(container, dsns[0])


@dataclass
class RabbitmqServer:
    """A RabbitMQ container: the administrator's AMQP URL (vhost `/`) and its management API."""

    container: Container
    url: str
    management: ManagementApi
    user: str = field(default="")
    password: str = field(default="", repr=False)

    def stop(self) -> None:
        self.container.stop()


def start_rabbitmq(deadline: Deadline, *, environ: Mapping[str, str] | None = None) -> RabbitmqServer:
    """RabbitMQ with its management plugin (15672), ready once an AMQP connection opens and the management
    API answers (the plugin starts after the AMQP listener)."""
    import aio_pika

    user, password = "ltm-admin", secrets.token_hex(12)
    env = {"RABBITMQ_DEFAULT_USER": user, "RABBITMQ_DEFAULT_PASS": password}
    found: list[RabbitmqServer] = []

    def ready(container: Container) -> Callable[[], object]:
        async def connect(url: str) -> None:
            connection = await aio_pika.connect(url, timeout=PROBE_TIMEOUT)
            await connection.close()

        def probe() -> None:
            if not found:
                amqp = container.address(5672)
                url = f"amqp://{quote(user, safe='')}:{quote(password, safe='')}@{amqp}/"
                api = ManagementApi(f"http://{container.address(15672)}", user, password)
                found.append(RabbitmqServer(container, url, api, user, password))
            server = found[0]
            run_blocking(connect(server.url))
            server.management.call("GET", "/overview", timeout=PROBE_TIMEOUT)

        return probe

    started(RABBITMQ, (5672, 15672), env, deadline, environ, ready)
    return found[0]


@dataclass
class RedisServer:
    """A Redis container and its URL (database 0): without ACL users, the passwordless default user's; with
    them, the first user's, and each user's in `user_urls`."""

    container: Container
    url: str
    user_urls: dict[str, str] = field(default_factory=dict, repr=False)

    def url_for(self, user: str) -> str:
        """The URL of ACL user `user` (with its password)."""
        return self.user_urls[user]

    def stop(self) -> None:
        self.container.stop()


def redis_command(users: Mapping[str, tuple[str, str]]) -> list[str]:
    """`redis-server` with only these ACL users (name: (password, rules)), passwords given hashed, and the
    passwordless `default` user off; the official image's other defaults stated (a command replaces them)."""
    command = ["redis-server", "--bind", "*", "-::*", "--protected-mode", "no"]
    command += ["--save", "", "--appendonly", "no", "--user", "default", "off"]
    for name, (password, rules) in users.items():
        digest = hashlib.sha256(password.encode()).hexdigest()
        command += ["--user", name, "on", f"#{digest}", *rules.split()]
    return command


def start_redis(
    deadline: Deadline,
    *,
    environ: Mapping[str, str] | None = None,
    users: Mapping[str, tuple[str, str]] | None = None,
) -> RedisServer:
    """Redis, ready once it answers PING (as the first of `users`, ACL users `name: (password, rules)`,
    when given: then nobody else may connect)."""
    import redis

    urls: list[str] = []
    user_urls: dict[str, str] = {}

    def ready(container: Container) -> Callable[[], object]:
        def probe() -> None:
            if not urls:
                address = container.address(6379)
                for name, (password, _) in (users or {}).items():
                    user_urls[name] = f"redis://{quote(name, safe='')}:{quote(password, safe='')}@{address}/0"
                urls.append(next(iter(user_urls.values()), f"redis://{address}/0"))
            client = redis.Redis.from_url(
                urls[0], socket_connect_timeout=PROBE_TIMEOUT, socket_timeout=PROBE_TIMEOUT
            )
            try:
                if not client.ping():
                    raise ConnectionError("PING was not answered with PONG")
            finally:
                client.close()

        return probe

    command = None if users is None else redis_command(users)
    container = started(REDIS, (6379,), {}, deadline, environ, ready, command)
    return RedisServer(container, urls[0], user_urls)
