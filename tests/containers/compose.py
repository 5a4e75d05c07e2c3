"""One run of deploy/compose.yaml under a project name of its own: build, up, inspect, logs, down.

The stack's published ports are free ports picked for the run (the machine's own services hold the defaults,
and other tests may run stacks at the same time); the images come from the LTM_*_IMAGE variables of the
environment when they are set (compose's defaults otherwise); the worker image gets a tag of the run's own,
removed with the stack.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker.testing.workers import free_port

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "deploy" / "compose.yaml"
#: building the image (pip downloads every dependency) and starting the stack on a loaded two-core machine
UP_TIMEOUT = 900.0
COMMAND_TIMEOUT = 180.0
PROJECT_LABEL = "com.docker.compose.project"
#: the development passwords of deploy/compose.yaml and deploy/rabbitmq/definitions.json
POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB = "ltm", "ltm-dev-password", "tomoribot"
SHARD_0_PASSWORD = "shard-0-dev-password"


class CommandFailed(AssertionError):
    pass


def run(args: list[str], *, env: dict[str, str] | None = None, timeout: float = COMMAND_TIMEOUT) -> str:
    """Run a command to its end; its stdout, or an AssertionError with both outputs."""
    try:
        done = subprocess.run(
            args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as error:
        raise CommandFailed(f"{' '.join(args)} did not finish in {timeout:.0f}s: {error.stderr!r}") from None
    if done.returncode != 0:
        raise CommandFailed(
            f"{' '.join(args)} exited {done.returncode}\n--- stdout\n{done.stdout[-4000:]}"
            f"\n--- stderr\n{done.stderr[-4000:]}"
        )
    return done.stdout


@dataclass
class ComposeStack:
    """deploy/compose.yaml as the project `ltmtest<hex>`, on free loopback ports."""

    project: str = field(default_factory=lambda: f"ltmtest{uuid.uuid4().hex[:10]}")
    ports: dict[str, int] = field(default_factory=dict)
    worker_image: str = ""
    timings: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.worker_image = self.worker_image or f"tomoribot-ltm-worker:{self.project}"
        for name in ("POSTGRES", "RABBITMQ", "RABBITMQ_MANAGEMENT", "REDIS"):
            self.ports.setdefault(name, free_port())

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({f"LTM_{name}_HOST_PORT": str(port) for name, port in self.ports.items()})
        env["LTM_WORKER_IMAGE"] = self.worker_image
        # compose 2.40 would build through buildx bake when it is installed; its own BuildKit client
        # otherwise (the engine's builder): the same either way, without the warning
        env.setdefault("COMPOSE_BAKE", "false")
        return env

    @property
    def postgres_dsn(self) -> str:
        port = self.ports["POSTGRES"]
        return f"postgresql://{POSTGRES_USER}:{POSTGRES_PASSWORD}@127.0.0.1:{port}/{POSTGRES_DB}"

    @property
    def shard_0_url(self) -> str:
        return f"amqp://shard-0:{SHARD_0_PASSWORD}@127.0.0.1:{self.ports['RABBITMQ']}/"

    @property
    def redis_url(self) -> str:
        # the shards' user of deploy/redis/users.acl: it may subscribe to the invalidations, nothing else
        return f"redis://shard:shard-dev-password@127.0.0.1:{self.ports['REDIS']}/0"

    def compose(self, *args: str, timeout: float = COMMAND_TIMEOUT) -> str:
        command = ["docker", "compose", "-f", str(COMPOSE_FILE), "-p", self.project, *args]
        return run(command, env=self.env, timeout=timeout)

    def timed(self, name: str, *args: str, timeout: float = COMMAND_TIMEOUT) -> str:
        start = time.monotonic()
        try:
            return self.compose(*args, timeout=timeout)
        finally:
            self.timings[name] = time.monotonic() - start

    def containers(self, service: str) -> list[str]:
        """The ids of a service's containers, running or not."""
        return self.compose("ps", "--all", "--quiet", service).split()

    def logs(self, tail: int = 60) -> str:
        try:
            return self.compose("logs", "--no-color", "--timestamps", "--tail", str(tail))
        except AssertionError as error:
            return f"(docker compose logs failed: {error})"

    def leftovers(self) -> dict[str, list[str]]:
        """Whatever of this project is still on the engine: containers, volumes, networks."""
        label = f"label={PROJECT_LABEL}={self.project}"
        return {
            "containers": run(["docker", "ps", "--all", "--quiet", "--filter", label]).split(),
            "volumes": run(["docker", "volume", "ls", "--quiet", "--filter", label]).split(),
            "networks": run(["docker", "network", "ls", "--quiet", "--filter", label]).split(),
        }

    def down(self) -> None:
        # nothing is in flight by now, so no stop needs its grace period; and a broker that ignores SIGTERM
        # (the Debian-based stand-in's wrapper script does) would otherwise hold `down` for compose's 60 s
        self.compose("down", "--volumes", "--remove-orphans", "--timeout", "15", timeout=300)

    def remove_image(self) -> None:
        subprocess.run(
            ["docker", "image", "rm", "--force", self.worker_image],
            capture_output=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )


def inspect(container: str) -> dict[str, Any]:
    """`docker inspect` of one container."""
    [found] = json.loads(run(["docker", "inspect", container]))
    return found  # type: ignore[no-any-return]


def container_logs(container: str) -> str:
    done = subprocess.run(
        ["docker", "logs", container], capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False
    )
    return done.stdout + done.stderr


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects among the lines of a log (the worker logs JSON; anything else is skipped)."""
    found = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                parsed = json.loads(line)
            except ValueError:
                continue
            if isinstance(parsed, dict):
                found.append(parsed)
    return found
