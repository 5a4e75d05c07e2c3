"""The workers under test: W ``python -m worker run`` processes the bench starts, or a fleet already running.

A spawned fleet gets the bench's database, vhost and Redis through the environment, logs at ``warning``
(so logging does not dominate the profile) into files next to each other in a temporary folder, and is
stopped with SIGTERM (SIGKILL after the grace period) at the end. "Ready" means every process consumes:
the work queue reports W consumers. An external fleet is only waited for (at least one consumer) and has
no CPU figure.

The same machinery starts the RabbitMQ ceiling's echo consumers (``python -m bench.echo``); each child is a
``sim.process.ModuleProcess``, the e2e tests' worker process too. A child that exits early is a
``ProcessFailed`` (``FleetError`` is one).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import aio_pika

from bench.cpu import process_cpu_seconds
from sim.process import ModuleProcess, ProcessFailed, stop_all
from worker.config import Settings, declared, env_with

READY_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0


class FleetError(ProcessFailed):
    """The workers did not start, or stopped on their own."""


async def consumer_count(url: str, queue: str) -> int:
    """How many consumers ``queue`` has (0 when it does not exist yet)."""
    connection = await aio_pika.connect(url, timeout=10)
    try:
        channel = await connection.channel()
        try:
            declared = await channel.declare_queue(queue, passive=True)
        except aio_pika.exceptions.ChannelClosed:
            return 0
        return int(declared.declaration_result.consumer_count or 0)
    finally:
        with contextlib.suppress(Exception):
            await connection.close()


class Processes:
    """Child processes running one Python module each (sim.process), with their own log files."""

    def __init__(
        self, name: str, module: str, args: Sequence[str], env: Mapping[str, str], log_dir: Path
    ) -> None:
        self.name = name
        self.module = module
        self.args = list(args)
        self.env = dict(env)
        self.log_dir = log_dir
        self.children: list[ModuleProcess] = []

    @property
    def pids(self) -> list[int]:
        return [child.pid for child in self.children]

    def log_path(self, index: int) -> Path:
        return self.log_dir / f"{self.name}-{index}.log"

    def start(self, count: int) -> None:
        for _ in range(count):
            index = len(self.children)
            child = ModuleProcess(
                self.module, self.args, self.env, self.log_path(index), f"{self.name} {index}"
            )
            self.children.append(child.start())

    def check_alive(self) -> None:
        for child in self.children:
            child.check_alive()

    async def wait_consuming(self, url: str, queue: str, count: int, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            if await consumer_count(url, queue) >= count:
                return
            if time.monotonic() > deadline:
                raise FleetError(
                    f"{self.name}: {queue} has fewer than {count} consumers after {timeout:.0f}s"
                )
            await asyncio.sleep(0.2)

    def cpu_seconds(self) -> float:
        return sum(process_cpu_seconds(pid) or 0.0 for pid in self.pids)

    async def stop(self) -> None:
        """SIGTERM every process this object started; SIGKILL the ones still there after the grace period."""
        await stop_all(self.children, STOP_TIMEOUT)


#: the file forms of the connection settings (worker/config/rules.py ``Env.file``)
_CONNECTION_FILES = frozenset(s.env.file_var for s in declared() if s.env.file)


def worker_environment(base: Mapping[str, str], settings: Settings, **fields: object) -> dict[str, str]:
    """The environment of a spawned worker: ``base`` with every setting of ``settings`` written out, the
    settings named in ``fields`` (the bench's own database and vhost) set instead, quiet logs and no HTTP
    port (several workers on one machine)."""
    # the bench's own services replace the connection settings, in whichever form (the variable or its _FILE)
    env = {key: value for key, value in base.items() if key not in _CONNECTION_FILES}
    quiet: dict[str, object] = {"log_level": "warning", "log_format": "json", "http_port": 0}
    env.update(env_with(settings, **(quiet | fields)))
    env["PYTHONUNBUFFERED"] = "1"
    return env


class SpawnedFleet:
    """W worker processes started (and stopped) by the bench."""

    def __init__(self, count: int, env: Mapping[str, str], log_dir: Path) -> None:
        self.count = count
        self.processes = Processes("worker", "worker", ["run"], env, log_dir)

    @property
    def pids(self) -> list[int]:
        return self.processes.pids

    async def start(self, url: str, queue: str) -> None:
        self.processes.start(self.count)
        await self.processes.wait_consuming(url, queue, self.count)

    def check_alive(self) -> None:
        self.processes.check_alive()

    def cpu_seconds(self) -> float | None:
        return self.processes.cpu_seconds()

    async def stop(self) -> None:
        await self.processes.stop()

    def describe(self) -> str:
        return f"{self.count} worker process{'es' if self.count != 1 else ''} (spawned)"


class ExternalFleet:
    """A fleet the operator runs; the bench only checks that somebody consumes."""

    def __init__(self, count: int) -> None:
        self.count = count

    @property
    def pids(self) -> list[int]:
        return []

    async def start(self, url: str, queue: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while await consumer_count(url, queue) < 1:
            if time.monotonic() > deadline:
                raise FleetError(f"--fleet external: nobody consumes {queue} in that vhost")
            await asyncio.sleep(0.5)

    def check_alive(self) -> None:
        return None

    def cpu_seconds(self) -> float | None:
        return None

    async def stop(self) -> None:
        return None

    def describe(self) -> str:
        return f"external fleet (assumed {self.count} process{'es' if self.count != 1 else ''})"


Fleet = SpawnedFleet | ExternalFleet
