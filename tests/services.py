"""Where the test suite's Postgres, RabbitMQ and Redis come from, and per-test isolation on top of them.

Each service is resolved on its own, the first time a test asks for it, in this order:

1. a URL in the environment (`LTM_TEST_POSTGRES_DSN`, `LTM_TEST_RABBITMQ_URL`, `LTM_TEST_REDIS_URL`);
2. a container started with testcontainers for the rest of the session, when a Docker engine answers: the
   image of worker/testing/images.py (`LTM_POSTGRES_IMAGE`, `LTM_RABBITMQ_IMAGE`, `LTM_REDIS_IMAGE` override
   it), started by the shipped worker/testing/containers.py (a bounded start, readiness that means ready);
   per-test vhosts go through the container's management API;
3. the local default (the services this machine kind starts on 127.0.0.1).

The pytest header says which of the three each service takes (`describe_sources`), without starting anything.

Nothing here touches Docker or the network before a test asks for a service, so unit tests stay offline.
A service that cannot be reached fails the test that needs it (never skips it), naming the service, the URL
tried and how to provide one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import secrets
import shutil
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import aio_pika
import asyncpg
import pytest
import redis.asyncio as aioredis

from tests.support.commands import run_command
from worker.store.migrate import apply_migrations
from worker.testing import images
from worker.testing.containers import Deadline, run_blocking, start_postgres, start_rabbitmq, start_redis
from worker.testing.images import Image
from worker.testing.management import ManagementApi

__all__ = ["ManagementApi"]  # re-exported: tests/integration/test_deploy.py uses it through this module

#: run a one-off coroutine to completion from synchronous code, also inside a running loop (the kit's)
run_async = run_blocking

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0
DOCKER_PING_TIMEOUT = 2.0
CONTAINER_READY_TIMEOUT = 90.0
RABBITMQCTL_TIMEOUT = 60.0


@dataclass(frozen=True)
class ServiceSpec:
    """One kind of service the tests need, and every way of getting it."""

    name: str
    env_var: str
    local_url: str
    image: Image
    start_command: str


POSTGRES = ServiceSpec(
    name="Postgres",
    env_var="LTM_TEST_POSTGRES_DSN",
    local_url="postgresql://postgres@127.0.0.1:5432/postgres",
    image=images.POSTGRES,
    start_command="pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start",
)
RABBITMQ = ServiceSpec(
    name="RabbitMQ",
    env_var="LTM_TEST_RABBITMQ_URL",
    local_url="amqp://guest:guest@127.0.0.1:5672/",
    image=images.RABBITMQ,
    start_command="rabbitmq-server -detached && rabbitmqctl await_startup",
)
REDIS = ServiceSpec(
    name="Redis",
    env_var="LTM_TEST_REDIS_URL",
    local_url="redis://127.0.0.1:6379/0",
    image=images.REDIS,
    start_command='redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no',
)
RABBITMQ_MANAGEMENT_ENV_VAR = "LTM_TEST_RABBITMQ_MANAGEMENT_URL"


class ServiceUnavailable(Exception):
    """A service a test needs cannot be reached or prepared; the message says how to provide it."""


@dataclass(frozen=True)
class StartedService:
    """What a started container offers: its URL(s) and how to stop it."""

    url: str
    stop: Callable[[], None]
    management_url: str | None = None
    #: the container's name, for `docker exec` (a broker's own rabbitmqctl)
    container: str | None = None


@dataclass(frozen=True)
class Endpoint:
    """A resolved service: its URL and where it came from (for error messages)."""

    spec: ServiceSpec
    url: str
    origin: str
    management_url: str | None = None
    container: str | None = None

    def unavailable(self, problem: object) -> ServiceUnavailable:
        """An error naming the service, the URL tried, why, and how to provide one."""
        if self.origin == "env":
            source = f"from {self.spec.env_var}"
            advice = f"Check {self.spec.env_var}, or unset it to use a container or the local server."
        elif self.origin == "container":
            source = f"testcontainers, image {self.spec.image.resolve()} ({self.spec.image.env_var})"
            advice = f"Set {self.spec.env_var} to a running server's URL instead."
        else:
            source = f"local default: {self.spec.env_var} is not set and no Docker engine answered"
            advice = (
                f"Set {self.spec.env_var} to a running server's URL, "
                f"or start the local one: {self.spec.start_command}"
            )
        reason = str(problem).rstrip(". ")
        return ServiceUnavailable(
            f"{self.spec.name} is not usable at {redact(self.url)} ({source}): {reason}. {advice}"
        )


def redact(url: str) -> str:
    """The URL with its password hidden, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def with_path(url: str, path: str) -> str:
    """The URL with its path replaced (database name, vhost), query and credentials kept."""
    return urlunsplit(urlsplit(url)._replace(path=path))


def host_port(host: str, port: int) -> str:
    """`host:port`, with an IPv6 literal in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def describe(error: BaseException) -> str:
    """`Type: message` for an exception, including ones whose str() is empty."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def docker_engine_reachable(timeout: float = DOCKER_PING_TIMEOUT) -> bool:
    """Whether a Docker engine answers a ping (through the usual DOCKER_HOST / socket), within `timeout`."""
    try:
        import docker  # type: ignore[import-untyped]
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=timeout)
    except Exception:  # no socket, refused, timed out, bad DOCKER_HOST: all mean "no engine"
        return False
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


def failure(error: ServiceUnavailable) -> BaseException:
    """What fails the current test (not skips it): a missing service is a broken setup, not an optional test.

    Raise it `from None`: the message already says what went wrong, without the chain of causes.
    """
    return pytest.fail.Exception(str(error), pytrace=False)


# --- containers (the shipped worker/testing/containers.py) ---------------------------------------------


def start_postgres_container() -> StartedService:
    """A Postgres container for the session; its URL is the superuser's, on database `postgres`."""
    server = start_postgres(Deadline(CONTAINER_READY_TIMEOUT))
    return StartedService(url=server.dsn, stop=server.stop)


def start_rabbitmq_container() -> StartedService:
    """A RabbitMQ container (management image) for the session: its administrator's URL, and the management
    API that per-test vhosts are made through."""
    server = start_rabbitmq(Deadline(CONTAINER_READY_TIMEOUT))
    return StartedService(
        url=server.url,
        stop=server.stop,
        management_url=server.management.base_url,
        container=server.container.name,
    )


def start_redis_container() -> StartedService:
    """A Redis container for the session."""
    server = start_redis(Deadline(CONTAINER_READY_TIMEOUT))
    return StartedService(url=server.url, stop=server.stop)


CONTAINER_STARTERS: Mapping[str, Callable[[], StartedService]] = {
    POSTGRES.name: start_postgres_container,
    RABBITMQ.name: start_rabbitmq_container,
    REDIS.name: start_redis_container,
}


# --- RabbitMQ vhosts ------------------------------------------------------------------------------------


class VhostAdmin(Protocol):
    """Creates and deletes RabbitMQ vhosts."""

    async def create(self, vhost: str, user: str) -> None:
        """Create `vhost` and give `user` full permissions on it."""

    async def delete(self, vhost: str) -> None:
        """Delete `vhost` (and everything in it); a missing vhost is fine."""

    async def policy(self, vhost: str, name: str, pattern: str, definition: dict[str, Any]) -> None:
        """Set the queue policy `name` on `vhost` for the queues `pattern` matches."""

    async def queue_policy(self, vhost: str, queue: str) -> str | None:
        """The policy the broker applies to `queue` (None: none, or no such queue)."""


@dataclass(frozen=True)
class Rabbitmqctl:
    """Vhosts through `rabbitmqctl`, for a broker on this machine without the management plugin."""

    executable: str

    async def _run(self, *args: str) -> None:
        code, text = await run_command(self.executable, *args, timeout=RABBITMQCTL_TIMEOUT)
        if code != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} exited {code}: {text}")

    async def create(self, vhost: str, user: str) -> None:
        """`add_vhost`, then `set_permissions` with full rights."""
        await self._run("add_vhost", vhost)
        await self._run("set_permissions", "-p", vhost, user, ".*", ".*", ".*")

    async def queue_policy(self, vhost: str, queue: str) -> str | None:
        """`list_queues name policy`: the policy applied to `queue`, None when none is (or no such queue)."""
        code, text = await run_command(
            self.executable, "-q", "list_queues", "-p", vhost, "name", "policy", timeout=RABBITMQCTL_TIMEOUT
        )
        for line in text.splitlines() if code == 0 else []:
            name, _, policy = line.partition("\t")
            if name == queue:
                return policy.strip() or None
        return None

    async def policy(self, vhost: str, name: str, pattern: str, definition: dict[str, Any]) -> None:
        """`set_policy` for the queues `pattern` matches."""
        await self._run(
            "set_policy", "-p", vhost, "--apply-to", "queues", name, pattern, json.dumps(definition)
        )

    async def delete(self, vhost: str) -> None:
        """`delete_vhost`; a vhost that is already gone is fine."""
        try:
            await self._run("delete_vhost", vhost)
        except RuntimeError as error:
            text = str(error).lower()
            if not any(gone in text for gone in ("does not exist", "does_not_exist", "not found")):
                raise


def is_this_machine(host: str) -> bool:
    """Whether `host` names this machine (loopback or its own host name)."""
    if host in {"localhost", socket.gethostname(), socket.getfqdn()}:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def amqp_credentials(url: str) -> tuple[str, str]:
    """The user and password in an AMQP URL (AMQP's guest/guest when absent)."""
    parts = urlsplit(url)
    user = unquote(parts.username) if parts.username else "guest"
    password = unquote(parts.password) if parts.password is not None else "guest"
    return user, password


# --- where each service comes from, for the pytest header ------------------------------------------------


def describe_sources(
    environ: Mapping[str, str] | None = None, docker_reachable: Callable[[], bool] = docker_engine_reachable
) -> list[str]:
    """One line per service saying where it will come from: the environment's URL (password hidden), a
    container of which image, or the local default. Starts nothing; pings Docker only when a service has
    no URL in the environment."""
    env = os.environ if environ is None else environ
    specs = (POSTGRES, RABBITMQ, REDIS)
    docker: bool | None = None
    lines = []
    for spec in specs:
        url = env.get(spec.env_var, "").strip()
        if url:
            lines.append(f"{spec.name}: {redact(url)} (from {spec.env_var})")
            continue
        if docker is None:
            docker = docker_reachable()
        if docker:
            image = spec.image
            lines.append(
                f"{spec.name}: container, image {image.resolve(env)} "
                f"({image.env_var} overrides it; {spec.env_var} not set)"
            )
        else:
            lines.append(
                f"{spec.name}: local default {spec.local_url} "
                f"({spec.env_var} not set, no Docker engine answers)"
            )
    return lines


# --- the session's services -----------------------------------------------------------------------------


@dataclass
class Services:
    """The session's view of Postgres, RabbitMQ and Redis, resolved lazily, one service at a time.

    Resolution results (and failures) are remembered for the session, so a dead service costs one probe,
    not one per test. `close()` stops any container this object started.
    """

    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    docker_reachable: Callable[[], bool] = docker_engine_reachable
    starters: Mapping[str, Callable[[], StartedService]] = field(default_factory=lambda: CONTAINER_STARTERS)
    _docker: bool | None = field(default=None, init=False)
    _endpoints: dict[str, Endpoint] = field(default_factory=dict, init=False)
    _errors: dict[str, ServiceUnavailable] = field(default_factory=dict, init=False)
    _started: list[StartedService] = field(default_factory=list, init=False)
    _vhost_admin: VhostAdmin | None = field(default=None, init=False)
    #: the session's migrated template database (`ltm_test_tpl_<hex>`), made the first time a test asks
    _template: str | None = field(default=None, init=False)

    # resolution (blocking: Docker calls; the async methods below run it in a thread)

    def resolve(self, spec: ServiceSpec) -> Endpoint:
        """Where `spec` comes from this session: environment, else container, else local default."""
        if spec.name in self._endpoints:
            return self._endpoints[spec.name]
        if spec.name in self._errors:
            raise self._errors[spec.name]
        endpoint = self._resolve_uncached(spec)
        self._endpoints[spec.name] = endpoint
        return endpoint

    def _resolve_uncached(self, spec: ServiceSpec) -> Endpoint:
        from_env = self.environ.get(spec.env_var, "").strip()
        management = None
        if spec is RABBITMQ:
            management = self.environ.get(RABBITMQ_MANAGEMENT_ENV_VAR, "").strip() or None
        if from_env:
            return Endpoint(spec, from_env, "env", management)
        if self._docker is None:
            self._docker = self.docker_reachable()
        if not self._docker:
            return Endpoint(spec, spec.local_url, "local", management)
        try:
            started = self.starters[spec.name]()
        except Exception as error:
            # ContainerError names the image and the LTM_*_IMAGE variable that overrides it
            self._errors[spec.name] = ServiceUnavailable(
                f"{spec.name}: a Docker engine answered but the container did not start: "
                f"{describe(error)}. Or set {spec.env_var} to a running server's URL instead."
            )
            raise self._errors[spec.name] from error
        self._started.append(started)
        return Endpoint(
            spec, started.url, "container", management or started.management_url, started.container
        )

    async def _resolved(self, spec: ServiceSpec) -> Endpoint:
        try:
            return await asyncio.to_thread(self.resolve, spec)
        except ServiceUnavailable as error:
            raise failure(error) from None

    def close(self) -> None:
        """Drop the session's template database, stop the containers this session started (newest first)."""
        if self._template is not None and POSTGRES.name in self._endpoints:
            template, self._template = self._template, None
            try:
                run_async(_drop_database(self._endpoints[POSTGRES.name], template))
            except Exception as error:
                log.warning("template database %s was not dropped: %s", template, describe(error))
        while self._started:
            with contextlib.suppress(Exception):
                self._started.pop().stop()

    # Postgres

    @contextlib.asynccontextmanager
    async def fresh_database(self, *, migrated: bool = False) -> AsyncIterator[str]:
        """A new database `ltm_test_<hex>`, dropped WITH (FORCE) on exit; yields its DSN. Empty, or with
        ``migrated`` every migration applied: a copy (`CREATE DATABASE ... TEMPLATE`, milliseconds) of the
        session's template, migrated once the first time a test asks."""
        endpoint = await self._resolved(POSTGRES)
        template = await self._migrated_template(endpoint) if migrated else "template0"
        async with _fresh_database(endpoint, template) as dsn:
            yield dsn

    async def _migrated_template(self, endpoint: Endpoint) -> str:
        if self._template is None:
            name = f"ltm_test_tpl_{secrets.token_hex(6)}"
            await _create_database(endpoint, name, "template0")
            try:
                await apply_migrations(with_path(endpoint.url, f"/{name}"))
                # nobody may connect to it any more: a connection would make every copy fail
                # ("source database is being accessed by other users")
                admin = await _admin_connection(endpoint)
                try:
                    await admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
                finally:
                    await admin.close()
            except BaseException:
                await _drop_database(endpoint, name)
                raise
            self._template = name
        return self._template

    # RabbitMQ

    @contextlib.asynccontextmanager
    async def fresh_vhost(self) -> AsyncIterator[str]:
        """A new vhost `ltm-test-<hex>` with full permissions for the URL's user, deleted on exit; yields
        the AMQP URL that selects it."""
        endpoint = await self._resolved(RABBITMQ)
        try:
            await _check_amqp(endpoint)
            admin = await asyncio.to_thread(self._admin_for, endpoint)
        except ServiceUnavailable as error:
            raise failure(error) from None
        async with _fresh_vhost(endpoint, admin) as url:
            yield url

    def broker_admin(self) -> VhostAdmin:
        """How this session administers its broker: the management API (`ManagementApi`, also users and
        permissions), else `Rabbitmqctl` on the broker's own machine. Resolves RabbitMQ (blocking)."""
        return self._admin_for(self.resolve(RABBITMQ))

    def _admin_for(self, endpoint: Endpoint) -> VhostAdmin:
        if self._vhost_admin is not None:
            return self._vhost_admin
        user, password = amqp_credentials(endpoint.url)
        host = urlsplit(endpoint.url).hostname or "localhost"
        management_url = endpoint.management_url or f"http://{host_port(host, 15672)}"
        api = ManagementApi.from_url(management_url, user, password)
        executable = shutil.which("rabbitmqctl")
        if api.answers():
            self._vhost_admin = api
        elif executable and is_this_machine(host):
            self._vhost_admin = Rabbitmqctl(executable)
        else:
            raise endpoint.unavailable(
                f"per-test vhosts need the management API (none answered at {api.base_url}; "
                f"set {RABBITMQ_MANAGEMENT_ENV_VAR}) or rabbitmqctl on the broker's own machine"
            )
        return self._vhost_admin

    # Redis

    async def redis_url(self) -> str:
        """The Redis URL, once it has answered PING."""
        endpoint = await self._resolved(REDIS)
        client = aioredis.from_url(
            endpoint.url, socket_connect_timeout=CONNECT_TIMEOUT, socket_timeout=CONNECT_TIMEOUT
        )
        try:
            await client.ping()
        except Exception as error:
            raise failure(endpoint.unavailable(describe(error))) from None
        finally:
            await client.aclose()
        return endpoint.url


async def _admin_connection(endpoint: Endpoint) -> asyncpg.Connection:
    try:
        return await asyncpg.connect(endpoint.url, timeout=CONNECT_TIMEOUT)
    except Exception as error:
        raise failure(endpoint.unavailable(describe(error))) from None


async def _create_database(endpoint: Endpoint, name: str, template: str) -> None:
    admin = await _admin_connection(endpoint)
    try:
        # the templates are never connected to (template0; the session's own refuses connections), so
        # concurrent sessions cannot block the copy
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    except Exception as error:
        raise failure(endpoint.unavailable(f"cannot create a test database: {describe(error)}")) from None
    finally:
        await admin.close()


async def _drop_database(endpoint: Endpoint, name: str) -> None:
    admin = await asyncpg.connect(endpoint.url, timeout=CONNECT_TIMEOUT)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@contextlib.asynccontextmanager
async def _fresh_database(endpoint: Endpoint, template: str = "template0") -> AsyncIterator[str]:
    name = f"ltm_test_{secrets.token_hex(8)}"
    await _create_database(endpoint, name, template)
    try:
        yield with_path(endpoint.url, f"/{name}")
    finally:
        try:  # a failed drop is logged, not raised: it must not hide the test's own error
            await _drop_database(endpoint, name)
        except Exception as error:
            log.warning("test database %s was not dropped: %s", name, describe(error))


async def database_exists(admin_dsn: str, name: str) -> bool:
    """Whether the server at ``admin_dsn`` has a database called ``name`` (a test's checks on the cleanup)."""
    admin = await asyncpg.connect(admin_dsn)
    try:
        return bool(await admin.fetchval("SELECT count(*) FROM pg_database WHERE datname = $1", name))
    finally:
        await admin.close()


async def _check_amqp(endpoint: Endpoint) -> None:
    try:
        connection = await aio_pika.connect(endpoint.url, timeout=CONNECT_TIMEOUT)
    except Exception as error:
        raise endpoint.unavailable(describe(error)) from error
    await connection.close()


@contextlib.asynccontextmanager
async def _fresh_vhost(endpoint: Endpoint, admin: VhostAdmin) -> AsyncIterator[str]:
    vhost = f"ltm-test-{secrets.token_hex(8)}"
    user, _ = amqp_credentials(endpoint.url)
    try:
        await admin.create(vhost, user)
    except Exception as error:
        with contextlib.suppress(Exception):
            await admin.delete(vhost)
        raise failure(
            endpoint.unavailable(f"cannot create vhost {vhost} ({type(admin).__name__}): {describe(error)}")
        ) from None
    try:
        yield with_path(endpoint.url, "/" + quote(vhost, safe=""))
    finally:
        try:  # a failed delete is logged, not raised: it must not hide the test's own error
            await admin.delete(vhost)
        except Exception as error:
            log.warning("test vhost %s was not deleted: %s", vhost, describe(error))
