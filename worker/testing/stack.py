"""The worker and its three services, started for a bot team's own integration tests.

`LtmStack.start()` starts, against one deadline:

1. Postgres, RabbitMQ (management image) and Redis in containers, concurrently (worker/testing/containers.py),
   their ports on 127.0.0.1, Redis with the users of deploy/redis/users.acl (random passwords);
2. the `worker` RabbitMQ user with the permissions of deploy/rabbitmq/definitions.json;
3. `worker migrate` on the database `tomoribot` (the bot's database in deploy/, and the TypeScript stack's);
4. one or more `worker run` processes of the installed package (`python -m worker run`), as that user.

It is ready when every worker's `/readyz` says ready (consuming, Postgres and Redis answering) and the
broker shows the contract's topology: the four exchanges, and `ltm.create_memory` with one consumer per
worker. A start that does not get there in time raises `StackError` with the containers' and the workers'
logs.

`stack.shard()` then makes a shard's RabbitMQ user `shard-<n>` with CONTRACT.md's permissions (its own two
queues and routing keys only) and returns what the shard needs: its AMQP URL, the Redis URL of the shards'
Redis user (subscribe only), the Postgres DSN, `seed()` for a try-out's bot rows, and `client()`, the Python
shard kit's `LtmClient` connected as that shard. Each call gets a new shard id, so tests sharing a stack never
see each other's results or notices. `close()` stops the workers (SIGTERM) and removes the containers.

The users' grants are worker/testing/permissions.py; one `worker run` process is worker/testing/workers.py.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import quote

from contracts import names
from worker.redact import describe
from worker.testing.containers import (
    Container,
    ContainerError,
    Deadline,
    PostgresServer,
    RabbitmqServer,
    RedisServer,
    StartAbandoned,
    seconds_from_env,
    start_postgres,
    start_rabbitmq,
    start_redis,
)
from worker.testing.permissions import (
    REDIS_USER_RULES,
    WORKER_PERMISSIONS,
    WORKER_TOPIC_PERMISSIONS,
    redis_users,
    shard_permissions,
    shard_topic_permissions,
)
from worker.testing.seed import TryOut, seed_try_out
from worker.testing.workers import WorkerProcess, tail

if TYPE_CHECKING:
    from contracts.shard import LtmClient

__all__ = [
    "DEFAULT_TIMEOUT",
    "EXCHANGES",
    "REDIS_USER_RULES",
    "TIMEOUT_ENV",
    "WORKER_PERMISSIONS",
    "WORKER_TOPIC_PERMISSIONS",
    "LtmShard",
    "LtmStack",
    "StackError",
    "WorkerProcess",
    "shard_permissions",
    "shard_topic_permissions",
]

TIMEOUT_ENV = "LTM_STACK_TIMEOUT"
DEFAULT_TIMEOUT = 120.0
VHOST = "/"
DATABASE = "tomoribot"
WORKER_USER = "worker"
WORK_QUEUE = names.WORK_QUEUE
EXCHANGES = names.EXCHANGES


UNDERNEATH = "(the errors underneath, with their tracebacks: pytest -v, or StackError.underneath())"


class StackError(Exception):
    """The stack did not become ready in time (or a part of it failed); the message carries the reasons,
    each once, and the logs. It is raised `from None`: the errors underneath (the Docker engine's HTTP
    errors, a timed-out `worker migrate`) are `causes`, printed by `underneath()`, so a failed start reads
    as one block."""

    def __init__(self, message: str, causes: Sequence[BaseException] = ()) -> None:
        super().__init__(message)
        self.causes = tuple(causes)

    def underneath(self) -> str:
        """Each cause with its traceback and chain, as Python prints an uncaught error."""
        return "\n".join("".join(traceback.format_exception(cause)).rstrip() for cause in self.causes)

    def report(self, *, verbose: bool) -> str:
        """The message, and with `verbose` the errors underneath it."""
        if not verbose or not self.causes:
            return str(self)
        return f"{self}\n\n--- the errors underneath ---\n{self.underneath()}"


def reasons(errors: Sequence[BaseException]) -> str:
    """Each failure's sentence once (an engine that does not answer fails the three services alike), the
    Docker client's own errors named as the engine's."""
    lines: list[str] = []
    for error in errors:
        text = str(error)
        if type(error).__module__.split(".")[0] == "docker":
            text = f"the Docker engine (DOCKER_HOST, else its socket) did not answer: {describe(error)}"
        if text not in lines:
            lines.append(text)
    return "\n\n".join(lines)


def stack_timeout(environ: Mapping[str, str] | None = None) -> float:
    """`LTM_STACK_TIMEOUT` in seconds (a positive number), else 120."""
    return seconds_from_env(TIMEOUT_ENV, DEFAULT_TIMEOUT, environ)


@dataclass(frozen=True)
class LtmShard:
    """What one shard of the bot needs to talk to the stack: its own RabbitMQ user and queues' names, the
    Redis URL (cache invalidations, as the shards' Redis user: SUBSCRIBE and PING only) and the Postgres DSN
    (the bot tables)."""

    shard_id: int
    amqp_url: str
    redis_url: str
    postgres_dsn: str
    user: str
    password: str = field(repr=False)

    @property
    def results_queue(self) -> str:
        return names.shard_queue(self.shard_id, "results")

    @property
    def notifications_queue(self) -> str:
        return names.shard_queue(self.shard_id, "notifications")

    async def seed(self) -> TryOut:
        """A new guild with a persona, a user and the member Sparrow in the bot tables
        (worker/testing/seed.py); `.context()` and `.event(...)` build what names them."""
        return await seed_try_out(self.postgres_dsn)

    async def client(self, **options: Any) -> LtmClient:
        """The Python shard kit's client (`contracts.shard.LtmClient`) connected as this shard; `options` are
        its own (`on_notice`, `timeout`, ...). Use it as `async with await ltm_shard.client() as ltm:`."""
        from contracts.shard import LtmClient

        return await LtmClient.connect(self.amqp_url, self.shard_id, **options)


@dataclass
class LtmStack:
    """Postgres (migrated), RabbitMQ (the contract's topology and users), Redis and `worker run` processes."""

    postgres: PostgresServer
    rabbitmq: RabbitmqServer
    redis: RedisServer
    workers: list[WorkerProcess]
    worker_amqp_url: str
    log_dir: Path
    start_seconds: float = 0.0
    #: seconds of each start-up phase: `containers` (the three, concurrently), `migrate`, `workers` (to ready)
    timings: dict[str, float] = field(default_factory=dict)
    _shard_ids: Iterator[int] = field(default_factory=lambda: itertools.count(1), repr=False)

    @property
    def postgres_dsn(self) -> str:
        """The migrated database's DSN (its superuser: seed and inspect freely)."""
        return self.postgres.dsn

    @property
    def redis_url(self) -> str:
        """Redis as the shards' user (SUBSCRIBE to the invalidations, PING)."""
        return self.redis.url_for("shard")

    @property
    def management(self) -> Any:
        """The broker's management API (worker.testing.management.ManagementApi), as its administrator."""
        return self.rabbitmq.management

    # start and stop

    @classmethod
    def start(
        cls,
        *,
        workers: int = 1,
        timeout: float | None = None,
        worker_env: Mapping[str, str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> LtmStack:
        """Start everything within `timeout` seconds (`LTM_STACK_TIMEOUT`, default 120) or raise StackError.

        `worker_env` adds `LTM_*` settings for the workers (e.g. `{"LTM_LOG_LEVEL": "debug"}`); `environ` is
        where image overrides (`LTM_*_IMAGE`) and timeouts are read (default: os.environ).
        """
        if workers < 1:
            raise ValueError("a stack runs at least one worker")
        began = time.monotonic()
        deadline = Deadline(stack_timeout(environ) if timeout is None else timeout)
        containers: list[Any] = []
        with ThreadPoolExecutor(max_workers=3, thread_name_prefix="ltm-stack") as pool:
            futures: list[Future[Any]] = [
                pool.submit(start_postgres, deadline, database=DATABASE, environ=environ),
                pool.submit(start_rabbitmq, deadline, environ=environ),
                pool.submit(start_redis, deadline, environ=environ, users=redis_users()),
            ]
            # the first failure ends the others' waits: a missing image fails the start at once
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            if any(future.exception() is not None for future in done):
                deadline.abandon()
            errors: list[BaseException] = []
            for future in futures:
                try:
                    containers.append(future.result())
                except StartAbandoned:
                    pass
                except BaseException as error:
                    errors.append(error)
        if errors:
            for started in containers:
                started.stop()
            raise StackError(
                f"the LTM test stack did not start:\n{reasons(errors)}\n{UNDERNEATH}", errors
            ) from None
        postgres, rabbitmq, redis = containers
        stack = cls(postgres, rabbitmq, redis, [], "", Path(tempfile.mkdtemp(prefix="ltm-stack-")))
        stack.timings["containers"] = time.monotonic() - began
        try:
            stack._start_workers(workers, deadline, dict(worker_env or {}))
        except BaseException as error:
            logs = stack.logs()
            stack.close()
            if isinstance(error, StackError | ContainerError):
                raise StackError(f"{error}\n\n{logs}\n{UNDERNEATH}", [error]) from None
            raise
        stack.start_seconds = time.monotonic() - began
        return stack

    def _start_workers(self, count: int, deadline: Deadline, extra: dict[str, str]) -> None:
        api = self.rabbitmq.management
        password = os.urandom(12).hex()
        api.put_user(WORKER_USER, password)
        api.set_permissions(VHOST, WORKER_USER, WORKER_PERMISSIONS)
        for grant in WORKER_TOPIC_PERMISSIONS:
            api.set_topic_permissions(VHOST, WORKER_USER, grant["exchange"], grant["write"], grant["read"])
        self.worker_amqp_url = f"amqp://{WORKER_USER}:{password}@{self.rabbitmq.container.address(5672)}/"
        env = {
            **os.environ,
            "LTM_POSTGRES_DSN": self.postgres.dsn,
            "LTM_RABBITMQ_URL": self.worker_amqp_url,
            "LTM_REDIS_URL": self.redis.url_for(WORKER_USER),
            **extra,
        }
        for name in ("LTM_POSTGRES_DSN_FILE", "LTM_RABBITMQ_URL_FILE", "LTM_REDIS_URL_FILE"):
            env.pop(name, None)
        began = time.monotonic()
        self._migrate(env, deadline)
        self.timings["migrate"] = time.monotonic() - began
        began = time.monotonic()
        self.workers = [WorkerProcess.spawn(index, env, self.log_dir) for index in range(count)]
        self._wait_ready(deadline)
        self.timings["workers"] = time.monotonic() - began

    def _migrate(self, env: Mapping[str, str], deadline: Deadline) -> None:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "worker", "migrate"],
                env=dict(env),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=max(deadline.remaining(), 1.0),
                check=False,
            )
        except subprocess.TimeoutExpired as error:
            raise StackError(f"`worker migrate` did not finish within {deadline.seconds:.0f} s") from error
        if done.returncode != 0:
            raise StackError(f"`worker migrate` exited {done.returncode}:\n{tail(done.stdout + done.stderr)}")

    def _wait_ready(self, deadline: Deadline) -> None:
        while True:
            exited = [w for w in self.workers if w.exit_code is not None]
            if exited:
                codes = ", ".join(f"worker {w.index} exited {w.exit_code}" for w in exited)
                raise StackError(f"a worker stopped before the stack was ready: {codes}")
            problem = self._readiness_problem()
            if problem is None:
                return
            if deadline.expired:
                raise StackError(
                    f"the LTM test stack was not ready within {deadline.seconds:.0f} s: {problem}"
                )
            time.sleep(min(0.2, deadline.remaining()))

    def _readiness_problem(self) -> str | None:
        waiting = [str(w.index) for w in self.workers if not w.ready()]
        if waiting:
            return f"/readyz of worker {', '.join(waiting)} does not say ready"
        api = self.rabbitmq.management
        try:
            missing = set(EXCHANGES) - api.exchanges(VHOST)
            queue = api.queue(VHOST, WORK_QUEUE)
        except (OSError, urllib.error.URLError) as error:
            return f"the management API did not answer: {error}"
        if missing:
            return f"exchanges not declared yet: {', '.join(sorted(missing))}"
        consumers = int((queue or {}).get("consumers") or 0)
        if consumers < len(self.workers):
            return f"{WORK_QUEUE} has {consumers} consumer(s), {len(self.workers)} expected"
        return None

    def logs(self) -> str:
        """The last lines of every container's and worker's log, for error messages."""
        parts: list[str] = []
        services: list[Container] = [self.postgres.container, self.rabbitmq.container, self.redis.container]
        for container in services:
            parts.append(f"--- {container.image.service} ({container.reference}) ---\n{container.logs()}")
        for worker in self.workers:
            parts.append(f"--- worker {worker.index} ({worker.log_path}) ---\n{worker.log()}")
        return "\n".join(parts)

    def close(self) -> None:
        """Stop the workers (SIGTERM to all, as an orchestrator would), then remove the containers."""
        for worker in self.workers:
            with contextlib.suppress(Exception):
                worker.terminate()
        for worker in self.workers:
            with contextlib.suppress(Exception):
                worker.stop()
        for service in (self.redis, self.rabbitmq, self.postgres):
            with contextlib.suppress(Exception):
                service.stop()
        shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    # shards

    def shard(self, shard_id: int | None = None) -> LtmShard:
        """User `shard-<n>` with the contract's permissions (a new `n` unless given), its AMQP URL and the
        rest.

        Its queues are the shard's to declare (CONTRACT.md section 2). `release(shard)` deletes the user and
        the queues again.
        """
        number = next(self._shard_ids) if shard_id is None else shard_id
        user, password = names.shard_user(number), os.urandom(12).hex()
        api = self.rabbitmq.management
        api.put_user(user, password)
        api.set_permissions(VHOST, user, shard_permissions(number))
        for grant in shard_topic_permissions(number):
            api.set_topic_permissions(VHOST, user, grant["exchange"], grant["write"], grant["read"])
        url = f"amqp://{quote(user, safe='')}:{password}@{self.rabbitmq.container.address(5672)}/"
        return LtmShard(number, url, self.redis_url, self.postgres.dsn, user, password)

    def release(self, shard: LtmShard) -> None:
        """Delete the shard's user and its two queues."""
        api = self.rabbitmq.management
        api.delete_user(shard.user)
        for queue in (shard.results_queue, shard.notifications_queue):
            api.delete_queue(VHOST, queue)
