"""Whether a test run left this machine's own services alone: looked at when the session starts and ends.

The test suite stops and restarts only servers of its own (tests/support/outages.py). This check notices when
the machine's RabbitMQ, Redis or Postgres went down or restarted during a run anyway: by the suite, or by
anything else on the machine (another test run). It looks only at services on this machine that answer
within a few seconds, where the ``LTM_TEST_*`` URLs (else the local defaults) point:

- Redis: ``INFO server``'s ``run_id``, new on every start;
- Postgres: ``pg_postmaster_start_time()`` (a restart) and ``pg_conf_load_time()`` (a configuration reload);
- RabbitMQ: one AMQP connection on the default vhost, held open for the session with heartbeats off;
  ``stop_app``, a restart or a lost node closes it. (The machine's broker has no management API to ask for
  its uptime, and ``rabbitmqctl status`` costs a second or two and reports the Erlang VM's uptime, which
  ``stop_app`` does not reset.)

It costs one connection per service at each end (a few milliseconds each) and runs only for a session that
runs more than unit tests (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg
import redis.asyncio as aioredis

from tests.services import POSTGRES, RABBITMQ, REDIS, ServiceSpec, is_this_machine, redact

PROBE_TIMEOUT = 3.0


class MachineServicesDisturbed(UserWarning):
    """A service of the machine restarted (or was reconfigured) while the tests ran."""


def local_url(spec: ServiceSpec, environ: Mapping[str, str]) -> str | None:
    """The URL the suite would use for ``spec`` (its ``LTM_TEST_*`` variable, else the local default)
    when it names this machine; None for a service elsewhere."""
    url = environ.get(spec.env_var, "").strip() or spec.local_url
    return url if is_this_machine(urlsplit(url).hostname or "") else None


async def _redis_identity(url: str) -> str:
    client = aioredis.Redis.from_url(url, socket_connect_timeout=PROBE_TIMEOUT, socket_timeout=PROBE_TIMEOUT)
    try:
        info = await client.info("server")
    finally:
        await client.aclose()
    return f"run_id {info['run_id']}"


async def _postgres_identity(dsn: str) -> str:
    conn = await asyncpg.connect(dsn, timeout=PROBE_TIMEOUT)
    try:
        row = await conn.fetchrow("SELECT pg_postmaster_start_time() AS started, pg_conf_load_time() AS conf")
    finally:
        await conn.close()
    assert row is not None
    return f"started {row['started'].isoformat()}, configuration loaded {row['conf'].isoformat()}"


def _with_heartbeats_off(url: str) -> str:
    """The AMQP URL on the default vhost with ``heartbeat=0``: an idle connection the broker keeps."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/", query="heartbeat=0&name=ltm-test-machine-guard"))


@dataclass
class MachineGuard:
    """What :meth:`start` saw of each local service; :meth:`finish` says what changed since."""

    environ: Mapping[str, str]
    identities: dict[str, tuple[str, str]] = field(default_factory=dict)
    connection: aio_pika.abc.AbstractConnection | None = None
    rabbitmq_url: str | None = None

    def _probes(self) -> dict[str, tuple[str, Callable[[str], Awaitable[str]]]]:
        probes: dict[str, tuple[str, Callable[[str], Awaitable[str]]]] = {}
        for spec, probe in ((REDIS, _redis_identity), (POSTGRES, _postgres_identity)):
            url = local_url(spec, self.environ)
            if url is not None:
                probes[spec.name] = (url, probe)
        return probes

    async def start(self) -> None:
        """Look at every local service that answers; one that does not is left out."""
        for name, (url, probe) in self._probes().items():
            with contextlib.suppress(Exception):
                self.identities[name] = (url, await asyncio.wait_for(probe(url), PROBE_TIMEOUT * 2))
        url = local_url(RABBITMQ, self.environ)
        if url is not None:
            with contextlib.suppress(Exception):
                self.connection = await aio_pika.connect(_with_heartbeats_off(url), timeout=PROBE_TIMEOUT)
                self.rabbitmq_url = url

    @property
    def watched(self) -> list[str]:
        return sorted([*self.identities, *([RABBITMQ.name] if self.connection else [])])

    async def finish(self) -> list[str]:
        """One line per service that went down, restarted or reloaded its configuration since
        :meth:`start`; the RabbitMQ connection is closed."""
        problems = []
        for name, (url, before) in self.identities.items():
            probe = self._probes()[name][1]
            try:
                after = await asyncio.wait_for(probe(url), PROBE_TIMEOUT * 2)
            except Exception as error:
                after = f"no answer ({type(error).__name__}: {error})"
            if after != before:
                problems.append(f"{name} at {redact(url)}: was {before}, now {after}")
        if self.connection is not None:
            try:
                channel = await asyncio.wait_for(self.connection.channel(), PROBE_TIMEOUT * 2)
                await channel.close()
            except Exception as error:
                where = f"{RABBITMQ.name} at {redact(self.rabbitmq_url or '')}"
                problems.append(
                    f"{where}: the connection held since the start of the run was closed (stopped or "
                    f"restarted): {type(error).__name__}: {error}"
                )
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.connection.close(), PROBE_TIMEOUT)
            self.connection = None
        return problems
