"""Where the bench runs: its own databases and its own RabbitMQ vhost, never the production ones.

Databases are created as ``ltm_bench_<hex>`` on the server the admin DSN points at and dropped after the
run. The vhost is created with ``rabbitmqctl`` when the broker is on this machine (``ltm-bench-<hex>``)
and deleted after; a remote broker needs ``--rabbitmq-url`` naming an existing vhost set aside for the
bench. With `LTM_BENCH_RABBITMQ_MANAGEMENT_URL` set (a broker in a container, whose port 15672 is published
elsewhere), the vhost is made and deleted through that management API instead, as the URL's user. Either way
the bench refuses a vhost whose work queue holds messages or has consumers it did not
start, so it cannot steal production events. ``--keep`` leaves everything in place and says where.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import secrets
import shutil
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import aio_pika
import asyncpg

from worker.broker.urls import vhost_of
from worker.config import env_of
from worker.redact import redact_url as redact
from worker.testing.management import FULL_PERMISSIONS, ManagementApi
from worker.testing.workers import free_port

RABBITMQCTL_TIMEOUT = 60.0
MANAGEMENT_ENV_VAR = "LTM_BENCH_RABBITMQ_MANAGEMENT_URL"


def management_url_from_env() -> str | None:
    return os.environ.get(MANAGEMENT_ENV_VAR, "").strip() or None


class SandboxError(RuntimeError):
    """The bench cannot set up (or safely use) its databases or vhost; the message says what to do."""


def with_path(url: str, path: str) -> str:
    """``url`` with its path (database name, vhost) replaced."""
    return urlunsplit(urlsplit(url)._replace(path=path))


def is_local(url: str) -> bool:
    """Whether the URL's host is this machine."""
    host = urlsplit(url).hostname or "localhost"
    if host in {"localhost", socket.gethostname(), socket.getfqdn()}:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class Sandbox:
    """The databases and vhost of one bench run; :meth:`close` removes what it created (unless ``keep``)."""

    admin_dsn: str
    keep: bool = False
    token: str = field(default_factory=lambda: secrets.token_hex(4))
    databases: list[str] = field(default_factory=list)
    vhost: str | None = None
    #: the broker's management API (`LTM_BENCH_RABBITMQ_MANAGEMENT_URL`): vhosts through it, not rabbitmqctl
    management_url: str | None = field(default_factory=management_url_from_env)
    _rabbitmqctl: str | None = None
    _management: ManagementApi | None = None

    async def new_database(self, suffix: str = "") -> str:
        """Create an empty database ``ltm_bench_<hex><suffix>``; its DSN."""
        name = f"ltm_bench_{self.token}{suffix}"
        try:
            admin = await asyncpg.connect(self.admin_dsn, timeout=10)
        except Exception as exc:
            raise SandboxError(f"cannot reach Postgres at {redact(self.admin_dsn)}: {exc}") from exc
        try:
            # template0: nobody is ever connected to it, so the copy cannot be blocked
            await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        except Exception as exc:
            raise SandboxError(
                f"cannot create database {name} on {redact(self.admin_dsn)} (the bench needs CREATEDB): {exc}"
            ) from exc
        finally:
            await admin.close()
        self.databases.append(name)
        return with_path(self.admin_dsn, f"/{name}")

    async def new_vhost(self, base_url: str) -> str:
        """Create ``ltm-bench-<hex>`` on the local broker of ``base_url`` with ``rabbitmqctl`` (or through
        the management API of ``management_url``); its URL."""
        if self.management_url:
            return await self._new_vhost_through_api(base_url, self.management_url)
        executable = shutil.which("rabbitmqctl")
        if not is_local(base_url) or executable is None:
            raise SandboxError(
                f"the broker at {redact(base_url)} is not on this machine (or rabbitmqctl is missing), so "
                "the bench cannot create its own vhost: pass --rabbitmq-url with an existing vhost set aside "
                "for the bench (its ltm.create_memory queue must be empty and unconsumed)"
            )
        self._rabbitmqctl = executable
        name = f"ltm-bench-{self.token}"
        user = unquote(urlsplit(base_url).username or "guest")
        await self._ctl("add_vhost", name)
        self.vhost = name
        await self._ctl("set_permissions", "-p", name, user, ".*", ".*", ".*")
        return with_path(base_url, "/" + quote(name, safe=""))

    async def _new_vhost_through_api(self, base_url: str, management_url: str) -> str:
        parts = urlsplit(base_url)
        user = unquote(parts.username or "guest")
        api = ManagementApi.from_url(management_url, user, unquote(parts.password or "guest"))
        name = f"ltm-bench-{self.token}"
        try:
            await asyncio.to_thread(api.put_vhost, name)
            self._management, self.vhost = api, name
            await asyncio.to_thread(api.set_permissions, name, user, FULL_PERMISSIONS)
        except Exception as exc:
            raise SandboxError(
                f"cannot create vhost {name} through the management API at {api.base_url} "
                f"({MANAGEMENT_ENV_VAR}): {exc}"
            ) from exc
        return with_path(base_url, "/" + quote(name, safe=""))

    async def set_policy(self, name: str, pattern: str, definition: dict[str, object]) -> None:
        """A queue policy on the vhost of :meth:`new_vhost` (by the management API or ``rabbitmqctl``)."""
        assert self.vhost is not None, "new_vhost first"
        if self._management is not None:
            await self._management.policy(self.vhost, name, pattern, definition)
            return
        body = json.dumps(definition)
        await self._ctl("set_policy", "-p", self.vhost, "--apply-to", "queues", name, pattern, body)

    async def _ctl(self, *args: str) -> None:
        assert self._rabbitmqctl is not None
        process = await asyncio.create_subprocess_exec(
            self._rabbitmqctl,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            output, _ = await asyncio.wait_for(process.communicate(), RABBITMQCTL_TIMEOUT)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise SandboxError(
                f"rabbitmqctl {' '.join(args)} did not finish in {RABBITMQCTL_TIMEOUT}s"
            ) from None
        if process.returncode != 0:
            text = output.decode(errors="replace").strip()
            raise SandboxError(f"rabbitmqctl {' '.join(args)} exited {process.returncode}: {text}")

    async def close(self) -> list[str]:
        """Drop what this run created, or list it when ``keep``; the lines to tell the operator."""
        if self.keep:
            kept = [f"kept database {name} on {redact(self.admin_dsn)}" for name in self.databases]
            if self.vhost:
                kept.append(f"kept RabbitMQ vhost {self.vhost} (rabbitmqctl delete_vhost {self.vhost})")
            return kept
        problems = []
        for name in self.databases:
            try:
                admin = await asyncpg.connect(self.admin_dsn, timeout=10)
                try:
                    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                finally:
                    await admin.close()
            except Exception as exc:
                problems.append(f"could not drop database {name}: {exc}")
        if self.vhost and self._management is not None:
            try:
                await self._management.delete(self.vhost)
            except Exception as exc:
                problems.append(f"could not delete vhost {self.vhost}: {exc}")
        elif self.vhost:
            try:
                await self._ctl("delete_vhost", self.vhost)
            except SandboxError as exc:
                problems.append(f"could not delete vhost {self.vhost}: {exc}")
        return problems


async def check_vhost_is_free(url: str, work_queue: str, *, consumers_allowed: bool = False) -> None:
    """Refuse a vhost whose work queue has messages (or consumers the bench did not start): it may be
    serving real shards. ``consumers_allowed`` for an external fleet, whose workers consume it."""
    connection = await aio_pika.connect(url, timeout=10)
    try:
        channel = await connection.channel()
        try:
            queue = await channel.declare_queue(work_queue, passive=True)
        except aio_pika.exceptions.ChannelClosed:
            return  # no work queue yet: nobody uses this vhost for the worker
        declared = queue.declaration_result
        if declared.message_count or (declared.consumer_count and not consumers_allowed):
            raise SandboxError(
                f"{work_queue} in vhost {vhost_of(url)!r} holds {declared.message_count} messages and has "
                f"{declared.consumer_count} consumers: it looks in use; give the bench a vhost of its own"
            )
    finally:
        await connection.close()


async def check_database_is_empty(dsn: str) -> None:
    """Refuse a database that already holds bot rows or processed events (``--fleet external``)."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        for table in ("servers", "ltm_processed_events"):
            exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", f"public.{table}")
            if exists and await conn.fetchval(f"SELECT EXISTS (SELECT 1 FROM {table})"):
                raise SandboxError(
                    f"{redact(dsn)} already holds rows in {table}: the bench seeds a database of its own; "
                    "create an empty one, run `worker migrate` on it and point the fleet at it"
                )
    finally:
        await conn.close()


@dataclass
class PrivateRedis:
    """A ``redis-server`` of the bench's own, on a free loopback port, keeping nothing on disk (its
    invalidations are for the bench's worker only)."""

    process: asyncio.subprocess.Process
    port: int

    @classmethod
    async def start(cls, workdir: Path) -> PrivateRedis:
        port = free_port()
        process = await asyncio.create_subprocess_exec(
            "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            cwd=workdir, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        return cls(process, port)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def stop(self) -> None:
        self.process.kill()
        await self.process.wait()


def env_for_worker(*, extra: Mapping[str, str] | None = None, **settings: object) -> dict[str, str]:
    """The environment of a worker (or a `worker` command) the bench starts: this one without any setting of
    its own (``LTM_*``, ``MAX_*``), then ``settings`` as ``env_of`` spells them, unbuffered output, and
    ``extra`` (raw variables: a limit raised, a port)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LTM_", "MAX_"))}
    env.update(env_of(**settings))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env
