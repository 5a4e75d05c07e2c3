"""The suite's services from testcontainers: an image the engine cannot start fails fast, naming the image and
the variable that overrides it, including when the registry hangs; the containers it does start are ready and
removed again."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.services import POSTGRES, Services, ServiceUnavailable
from worker.testing.containers import (
    LABEL,
    OWNER_LABEL,
    START_TIMEOUT_ENV,
    ContainerError,
    Deadline,
    start_postgres,
    start_redis,
)
from worker.testing.engine import owner

pytestmark = pytest.mark.usefixtures("docker_engine")


def our_containers() -> set[str]:
    """The names of the containers worker.testing started in this process (its labels and name prefix),
    running or not: another pytest-xdist process's are not this test's."""
    import docker  # type: ignore[import-untyped]

    client = docker.from_env()
    try:
        found = client.containers.list(all=True, filters={"label": [LABEL, f"{OWNER_LABEL}={owner()}"]})
        return {c.name for c in found if c.name.startswith("ltm-testing-")}
    finally:
        client.close()


def test_a_missing_image_fails_the_service_within_a_minute_naming_it_and_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LTM_POSTGRES_IMAGE", "does-not-exist:1")
    monkeypatch.delenv(START_TIMEOUT_ENV, raising=False)
    services = Services(environ={})
    began = time.monotonic()
    with pytest.raises(ServiceUnavailable) as raised:
        services.resolve(POSTGRES)
    took = time.monotonic() - began
    message = str(raised.value)
    print(f"a missing image failed after {took:.1f} s: {message}")
    assert took < 60
    assert "does-not-exist:1" in message
    assert "LTM_POSTGRES_IMAGE" in message
    assert "LTM_TEST_POSTGRES_DSN" in message
    # remembered for the session: the next test needing Postgres fails at once, with the same message
    with pytest.raises(ServiceUnavailable, match="does-not-exist:1"):
        services.resolve(POSTGRES)
    services.close()


@pytest.fixture
def hanging_registry() -> Iterator[str]:
    """A TCP server on loopback that accepts connections and never answers: a registry that hangs."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for connection in held:
            connection.close()
        server.close()


def test_a_registry_that_hangs_is_given_up_at_the_start_bound(
    hanging_registry: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = f"{hanging_registry}/ltm/never-answers:1"
    monkeypatch.setenv("LTM_REDIS_IMAGE", image)
    monkeypatch.setenv(START_TIMEOUT_ENV, "5")
    before = our_containers()
    began = time.monotonic()
    with pytest.raises(ContainerError) as raised:
        start_redis(Deadline(120))
    took = time.monotonic() - began
    message = str(raised.value)
    print(f"a hanging registry was given up after {took:.1f} s: {message}")
    assert f"did not start image {image} within 5 s" in message
    assert "LTM_REDIS_IMAGE" in message
    assert START_TIMEOUT_ENV in message
    assert took < 30
    assert our_containers() <= before


def test_a_container_that_is_up_answers_and_is_removed_on_stop() -> None:
    """The default Postgres container (or its LTM_POSTGRES_IMAGE): ready means a query answered."""
    import asyncpg

    from worker.testing.containers import run_blocking

    server = start_postgres(Deadline(120))
    try:

        async def version() -> str:
            connection = await asyncpg.connect(server.dsn, timeout=10)
            try:
                return str(await connection.fetchval("SHOW server_version"))
            finally:
                await connection.close()

        assert run_blocking(version())
        assert server.container.name in our_containers()
    finally:
        server.stop()
    assert server.container.name not in our_containers()


def test_a_ryuk_that_cannot_start_is_named_with_its_opt_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without TESTCONTAINERS_RYUK_DISABLED testcontainers starts Ryuk first; where its image cannot be had,
    the error says so and how to opt out, not that the service's image is wrong."""
    from testcontainers.core.config import testcontainers_config

    monkeypatch.setattr(testcontainers_config, "ryuk_disabled", False)
    monkeypatch.setattr(testcontainers_config, "ryuk_image", "does-not-exist/ryuk:1")
    before = our_containers()
    with pytest.raises(ContainerError) as raised:
        start_redis(Deadline(60))
    message = str(raised.value)
    assert "Ryuk" in message
    assert "TESTCONTAINERS_RYUK_DISABLED=true" in message
    assert "LTM_REDIS_IMAGE" not in message
    assert our_containers() <= before


def test_without_a_host_override_ports_are_reached_where_the_engine_bound_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """testcontainers guesses a gateway address wherever /.dockerenv exists; an engine publishing on one
    address (`dockerd --ip 127.0.0.1`, as here) answers only there. Without TC_HOST the container answers."""
    import docker
    import redis
    from testcontainers.core.config import testcontainers_config

    from worker.testing.containers import bound_address

    monkeypatch.delenv("TC_HOST", raising=False)
    monkeypatch.delenv("TESTCONTAINERS_HOST_OVERRIDE", raising=False)
    monkeypatch.setattr(testcontainers_config, "tc_host_override", None)
    server = start_redis(Deadline(120))
    try:
        client = redis.Redis.from_url(server.url, socket_connect_timeout=10, socket_timeout=10)
        try:
            assert client.ping()
        finally:
            client.close()
        engine = docker.from_env()
        try:
            ports = engine.containers.get(server.container.name).attrs["NetworkSettings"]["Ports"]
        finally:
            engine.close()
        bound = bound_address(ports)
        print(
            f"bound on {bound}, guessed {server.container.handle.get_container_host_ip()}, used {server.url}"
        )
        if bound is not None:
            assert server.container.host == bound
    finally:
        server.stop()


def test_the_one_address_a_port_is_bound_to() -> None:
    from worker.testing.containers import bound_address

    loopback = {"6379/tcp": [{"HostIp": "127.0.0.1", "HostPort": "32768"}]}
    assert bound_address(loopback) == "127.0.0.1"
    assert (
        bound_address(
            {"6379/tcp": [{"HostIp": "0.0.0.0", "HostPort": "1"}, {"HostIp": "::", "HostPort": "1"}]}
        )
        is None
    )
    assert bound_address({"6379/tcp": [{"HostIp": "::1", "HostPort": "1"}]}) is None
    assert bound_address({"5672/tcp": [{"HostIp": "10.0.0.2", "HostPort": "1"}], **loopback}) is None
    assert bound_address({"6379/tcp": None}) is None
