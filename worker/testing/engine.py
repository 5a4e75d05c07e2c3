"""One container started for a test, bounded: the engine side of worker/testing/containers.py (which starts
Postgres, RabbitMQ and Redis with it), and the deadline every step of a start counts against.

Images come from worker/testing/images.py (official, pinned; `LTM_*_IMAGE` overrides each). testcontainers is
imported only when a container is started, so this module imports without it (install the `testing` extra).

**Bounds.** Pulling, creating and starting a container is bounded by `LTM_CONTAINER_START_TIMEOUT` (45 s by
default): an engine that answers but cannot start an image (a missing image, a registry that does not answer
or hangs) fails within that bound with an error naming the image and the variable that overrides it. A
testcontainers call that hangs is abandoned (the container it may still create is removed when the call
returns). Readiness is bounded by the caller's deadline, and a container that exits fails at once, with its
log.

**Ports** are published where worker/testing/ports.py says (127.0.0.1 when the engine runs on this machine).

**Ryuk.** testcontainers starts its Ryuk container (`testcontainers/ryuk`) to remove containers left behind by
a killed test run. Where that image cannot be pulled or run (no registry, rootless or restricted CI), set
`TESTCONTAINERS_RYUK_DISABLED=true`: everything here removes its own containers (named `ltm-testing-*`,
labelled `org.tomoribot.ltm.testing`), except after a `kill -9` of the test run:
`docker rm -f $(docker ps -aq --filter label=org.tomoribot.ltm.testing --filter name=ltm-testing-)` cleans up
then. Each container also says which process started it (`org.tomoribot.ltm.testing.owner=<host>:<pid>`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from worker.redact import describe
from worker.testing.images import Image
from worker.testing.ports import publish_address, published_host

__all__ = [
    "DEFAULT_START_TIMEOUT",
    "LABEL",
    "OWNER_LABEL",
    "PROBE_TIMEOUT",
    "START_TIMEOUT_ENV",
    "Container",
    "ContainerError",
    "Deadline",
    "StartAbandoned",
    "owner",
    "run_blocking",
    "run_container",
    "seconds_from_env",
    "start_timeout",
    "started",
    "wait_until_ready",
]

T = TypeVar("T")

START_TIMEOUT_ENV = "LTM_CONTAINER_START_TIMEOUT"
DEFAULT_START_TIMEOUT = 45.0
LABEL = "org.tomoribot.ltm.testing"
#: the label saying which process started a container (`<host name>:<pid>`): a test run in several processes
#: (pytest-xdist) tells its own containers from another process's; a cleanup after a killed run can pick one
OWNER_LABEL = "org.tomoribot.ltm.testing.owner"


def owner() -> str:
    """This process's value of `OWNER_LABEL`."""
    return f"{socket.gethostname()}:{os.getpid()}"


PROBE_TIMEOUT = 5.0
POLL_SECONDS = 0.2
LOG_LINES = 40
INSTALL_HINT = "pip install -e '/path/to/checkout[testing]' (the testing extra, from the worker's checkout)"


class ContainerError(Exception):
    """A container did not start or did not become ready; the message says which image and what to do."""


class StartAbandoned(ContainerError):
    """This start gave up because another part of the same start-up failed (`Deadline.abandon()`)."""


class Deadline:
    """One point in time that every wait of a start-up counts down to; `abandon()` ends them all early."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds
        self._abandoned = threading.Event()

    def abandon(self) -> None:
        """Another part of the start-up failed: every wait on this deadline gives up at its next look."""
        self._abandoned.set()

    @property
    def abandoned(self) -> bool:
        return self._abandoned.is_set()

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.end


def seconds_from_env(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """The variable `name` in seconds (a positive number), else `default`."""
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if value > 0 else default


def start_timeout(environ: Mapping[str, str] | None = None) -> float:
    """`LTM_CONTAINER_START_TIMEOUT` in seconds (a positive number), else the default."""
    return seconds_from_env(START_TIMEOUT_ENV, DEFAULT_START_TIMEOUT, environ)


def run_blocking(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from blocking code, also when this thread runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ltm-testing") as pool:
        return pool.submit(asyncio.run, coroutine).result()


@dataclass
class Container:
    """A started container: its image, name, the host that reaches its published ports, and its log."""

    image: Image
    reference: str
    name: str
    handle: Any  # testcontainers.core.container.DockerContainer
    host: str = ""
    _ports: dict[int, int] = field(default_factory=dict, repr=False)

    def port(self, internal: int) -> int:
        """The host port published for `internal` (asked of the engine once)."""
        if internal not in self._ports:
            self._ports[internal] = int(self.handle.get_exposed_port(internal))
        return self._ports[internal]

    def address(self, internal: int) -> str:
        """`host:port` reaching `internal` from here (an IPv6 host in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port(internal)}"

    def status(self) -> str:
        """Docker's status of the container (`running`, `exited`, ...), `gone` when it is not there."""
        try:
            wrapped = self.handle.get_wrapped_container()
            wrapped.reload()
            return str(wrapped.status)
        except Exception:
            return "gone"

    def logs(self, lines: int = LOG_LINES) -> str:
        """The last `lines` lines of its output (stdout and stderr)."""
        try:
            raw = self.handle.get_wrapped_container().logs(tail=lines)
        except Exception as error:
            return f"(no log: {describe(error)})"
        return bytes(raw).decode(errors="replace").rstrip()

    def stop(self) -> None:
        """Remove the container (and its anonymous volumes)."""
        try:
            self.handle.stop()
        except Exception:
            with contextlib.suppress(Exception):
                self.handle.get_docker_client().client.api.remove_container(self.name, force=True, v=True)

    def failure(self, problem: str) -> ContainerError:
        """An error naming the service, image and override, with the container's log."""
        return ContainerError(
            f"{self.image.service} container {self.name} (image {self.reference}; {self.image.env_var} "
            f"overrides it): {problem}\n--- last lines of its log ---\n{self.logs()}"
        )


def _docker_container_class() -> Any:
    try:
        from testcontainers.core.container import DockerContainer
    except ImportError as error:
        raise ContainerError(f"starting containers needs testcontainers: {INSTALL_HINT}") from error
    return DockerContainer


def run_container(
    image: Image,
    *,
    ports: tuple[int, ...],
    env: Mapping[str, str],
    environ: Mapping[str, str] | None = None,
    timeout: float | None = None,
    deadline: Deadline | None = None,
    command: list[str] | None = None,
) -> Container:
    """Pull (when missing), create and start `image` with `ports` published (on :func:`publish_address`),
    within `timeout` seconds; `command` replaces the image's.

    The start runs in a thread: testcontainers and docker-py wait as long as the engine does (a pull from a
    registry that hangs never returns), so after the bound the start is abandoned and an error raised; the
    thread removes the container if the engine creates it later.
    """
    reference = image.resolve(environ)
    bound = start_timeout(environ) if timeout is None else timeout
    docker_container = _docker_container_class()
    name = f"ltm-testing-{image.service.lower()}-{secrets.token_hex(4)}"
    handle = (
        docker_container(reference)
        .with_name(name)
        .with_envs(**env)
        .with_exposed_ports(*ports)
        .with_kwargs(labels={LABEL: image.service.lower(), OWNER_LABEL: owner()})
    )
    address = publish_address(environ)
    if address:
        for port in ports:
            # docker-py's (address, None): that address, a free port
            handle.ports[str(port)] = (address, None)
    if command is not None:
        handle = handle.with_command(command)
    lock = threading.Lock()
    done = threading.Event()
    abandoned = False
    outcome: list[BaseException] = []

    def start() -> None:
        try:
            handle.start()
        except BaseException as error:
            outcome.append(error)
        with lock:
            done.set()
            late = abandoned
        if late or outcome:
            Container(image, reference, name, handle).stop()

    threading.Thread(target=start, name=f"start-{name}", daemon=True).start()
    limit = time.monotonic() + bound
    while not done.wait(max(0.0, min(POLL_SECONDS, limit - time.monotonic()))):
        if time.monotonic() >= limit or (deadline is not None and deadline.abandoned):
            break
    with lock:
        if not done.is_set():
            abandoned = True
    advice = (
        f"set {image.env_var} to an image the engine has or can pull (default {image.default}), "
        f"or raise {START_TIMEOUT_ENV} for a slow pull"
    )
    if abandoned and deadline is not None and deadline.abandoned:
        raise StartAbandoned(f"{image.service}: start of {reference} abandoned (another service failed)")
    if abandoned:
        raise ContainerError(
            f"{image.service}: the Docker engine did not start image {reference} within {bound:.0f} s "
            f"(pulling it from a registry that does not answer?); {advice}"
        )
    if outcome:
        error = outcome[0]
        text = describe(error)
        if "ryuk" in text.lower():
            raise ContainerError(
                f"{image.service}: testcontainers' Ryuk container, started before image {reference}, could "
                f"not start: {text}; set TESTCONTAINERS_RYUK_DISABLED=true (these containers remove "
                "themselves)"
            ) from error
        raise ContainerError(
            f"{image.service}: the Docker engine could not start image {reference}: {text}; {advice}"
        ) from error
    container = Container(image, reference, name, handle)
    try:
        container.host = published_host(handle)
    except BaseException:
        container.stop()
        raise
    return container


def wait_until_ready(container: Container, probe: Callable[[], object], deadline: Deadline) -> None:
    """Call `probe` until it returns without raising; fail at the deadline or when the container exits."""
    last: BaseException | None = None
    while True:
        if deadline.abandoned:
            raise StartAbandoned(f"{container.image.service}: abandoned before it was ready")
        status = container.status()
        if status not in {"created", "running", "restarting"}:
            raise container.failure(f"the container is {status} before it was ready")
        if status == "running":
            try:
                probe()
                return
            except Exception as error:
                last = error
        if deadline.expired:
            why = describe(last) if last else f"status {status}"
            raise container.failure(f"not ready within {deadline.seconds:.0f} s (last probe: {why})")
        time.sleep(min(POLL_SECONDS, deadline.remaining()))


def started(
    image: Image,
    ports: tuple[int, ...],
    env: Mapping[str, str],
    deadline: Deadline,
    environ: Mapping[str, str] | None,
    ready: Callable[[Container], Callable[[], object]],
    command: list[str] | None = None,
) -> Container:
    """A container of ``image`` started and ready (``ready`` makes its probe), or stopped and failed."""
    bound = min(start_timeout(environ), max(deadline.remaining(), 1.0))
    container = run_container(
        image, ports=ports, env=env, environ=environ, timeout=bound, deadline=deadline, command=command
    )
    try:
        wait_until_ready(container, ready(container), deadline)
    except BaseException:
        container.stop()
        raise
    return container


# --- the three services ------------------------------------------------------------------------------------
