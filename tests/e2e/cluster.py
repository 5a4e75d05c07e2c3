"""A private three-node RabbitMQ cluster on this machine, from the installed rabbitmq-server.

Each node has its own name (``ltm<hex>-<n>@localhost``), AMQP and distribution ports, data, log and pid
files under one temporary directory, an empty plugins file and a cookie of its own (``HOME`` points the
nodes and ``rabbitmqctl`` at it). So the machine's own broker (``rabbit@localhost`` on 5672) is neither
touched nor reachable from here: with another cookie no command of this module can talk to it.

The nodes run the server scripts under ``/usr/lib/rabbitmq/bin`` directly when they exist (Debian's
``/usr/sbin`` wrappers switch to the ``rabbitmq`` user, which resets ``HOME``), with Erlang's scheduler
busy-waiting off so three idle nodes do not burn the machine's cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from tests.e2e.stack import Stack
from tests.factories import BotRows
from worker.store.migrate import apply_migrations
from worker.testing.management import ManagementApi
from worker.testing.workers import free_port

#: Debian's real scripts (the /usr/sbin ones are wrappers that change user)
DEBIAN_BIN = Path("/usr/lib/rabbitmq/bin")
CTL_TIMEOUT = 120.0
ERL_ARGS = "+sbwt none +sbwtdcpu none +sbwtdio none"


def find_server() -> Path | None:
    """The directory of ``rabbitmq-server`` and ``rabbitmqctl``, or None where RabbitMQ is not installed."""
    if (DEBIAN_BIN / "rabbitmq-server").exists():
        return DEBIAN_BIN
    found = shutil.which("rabbitmq-server")
    return Path(found).resolve().parent if found else None


@dataclass(frozen=True)
class Node:
    """One node of the cluster."""

    index: int
    name: str
    amqp_port: int
    dist_port: int
    base: Path
    #: the node's management API (its vhosts are HTTP calls, not a `rabbitmqctl` VM start each)
    http_port: int = 0

    def url(self, vhost: str = "") -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/{vhost}"

    def management(self) -> ManagementApi:
        return ManagementApi(f"http://127.0.0.1:{self.http_port}", "guest", "guest")


class RabbitCluster:
    """Three nodes joined into one cluster; :meth:`close` stops them and removes their files."""

    def __init__(self, bin_dir: Path, size: int = 3, *, config: str = "", management: bool = True) -> None:
        """``config``: rabbitmq.conf lines every node gets after the listener's. ``management``: each node
        runs the management plugin on a port of its own (the per-test vhosts); a measurement of the broker's
        own CPU goes without it."""
        self.bin_dir = bin_dir
        self.config = config
        self.dir = Path(tempfile.mkdtemp(prefix="ltm-rmq-cluster-"))
        prefix = f"ltm{secrets.token_hex(3)}"
        taken: set[int] = set()
        self.nodes: list[Node] = []
        for index in range(1, size + 1):
            amqp, dist, http = self._port(taken), self._port(taken), self._port(taken)
            self.nodes.append(
                Node(index, f"{prefix}-{index}@localhost", amqp, dist, self.dir / f"node{index}", http)
            )
        cookie = self.dir / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16))
        cookie.chmod(0o400)
        self.management = management
        (self.dir / "enabled_plugins").write_text("[rabbitmq_management].\n" if management else "[].\n")
        (self.dir / "rabbitmq-env.conf").write_text("")

    @staticmethod
    def _port(taken: set[int]) -> int:
        while True:
            port = free_port()
            if port not in taken:
                taken.add(port)
                return port

    # -- processes -------------------------------------------------------------------------------------

    def _env(self, node: Node) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        conf = node.base / "rabbitmq.conf"
        env.update(
            HOME=str(self.dir),
            RABBITMQ_CONF_ENV_FILE=str(self.dir / "rabbitmq-env.conf"),
            RABBITMQ_NODENAME=node.name,
            RABBITMQ_NODE_PORT=str(node.amqp_port),
            RABBITMQ_DIST_PORT=str(node.dist_port),
            RABBITMQ_MNESIA_BASE=str(node.base / "mnesia"),
            RABBITMQ_LOG_BASE=str(node.base / "log"),
            RABBITMQ_PID_FILE=str(node.base / "rabbitmq.pid"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.dir / "enabled_plugins"),
            RABBITMQ_CONFIG_FILE=str(conf),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=ERL_ARGS,
            ERL_EPMD_ADDRESS="127.0.0.1",
        )
        return env

    def ctl(self, node: Node, *args: str, tool: str = "rabbitmqctl", timeout: float = CTL_TIMEOUT) -> str:
        """Run ``rabbitmqctl -n NODE ARGS`` (or another CLI tool); its output; raises when it fails."""
        done = subprocess.run(
            [str(self.bin_dir / tool), "-n", node.name, *args],
            env=self._env(node),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{tool} -n {node.name} {' '.join(args)} exited {done.returncode}: "
                f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
            )
        return done.stdout

    def start_node(self, node: Node) -> None:
        """Start ``node`` (detached) and wait until it has booted (and, after a restart, rejoined)."""
        self._launch(node)
        self.await_startup(node)

    def _launch(self, node: Node) -> None:
        node.base.mkdir(exist_ok=True)
        management = (
            f"management.tcp.ip = 127.0.0.1\nmanagement.tcp.port = {node.http_port}\n"
            if self.management
            else ""
        )
        (node.base / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{node.amqp_port}\n"
            + management
            # the test's clients connect as guest over loopback only
            + "loopback_users.guest = false\n"
            + self.config
        )
        subprocess.run(
            [str(self.bin_dir / "rabbitmq-server"), "-detached"],
            env=self._env(node),
            capture_output=True,
            timeout=CTL_TIMEOUT,
            check=True,
        )

    def await_startup(self, node: Node) -> None:
        # right after -detached the node may not be registered with epmd yet: retry until it is
        deadline = time.monotonic() + CTL_TIMEOUT
        while True:
            try:
                self.ctl(node, "await_startup", "--timeout", "60")
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def stop_node(self, node: Node) -> None:
        """Stop ``node`` (the whole Erlang VM) and wait until it is gone."""
        self.ctl(node, "stop")

    def start(self) -> RabbitCluster:
        """Boot every node and join nodes 2.. to node 1."""
        first, *others = self.nodes
        for node in self.nodes:  # boot side by side, then wait for each
            self._launch(node)
        for node in self.nodes:
            self.await_startup(node)
        for node in others:
            self.ctl(node, "stop_app")
            self.ctl(node, "join_cluster", first.name)
            self.ctl(node, "start_app")
        status = self.ctl(first, "cluster_status", "--formatter", "json")
        for node in self.nodes:
            assert node.name in status, f"{node.name} did not join: {status}"
        return self

    def close(self) -> None:
        """Stop every node (killing one that does not stop) and remove the cluster's files."""
        for node in self.nodes:
            with contextlib.suppress(Exception):
                self.ctl(node, "stop", timeout=30)
            pid_file = node.base / "rabbitmq.pid"
            with contextlib.suppress(Exception):
                os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- per test ------------------------------------------------------------------------------------------

    def add_vhost(self, vhost: str) -> None:
        """``vhost`` with every permission for guest: through the first node's management API, else its
        ``rabbitmqctl``."""
        first = self.nodes[0]
        if not self.management:
            self.ctl(first, "add_vhost", vhost)
            self.ctl(first, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
            return
        api = first.management()
        api.put_vhost(vhost)
        api.set_permissions(vhost, "guest", {"configure": ".*", "write": ".*", "read": ".*"})

    def delete_vhost(self, vhost: str) -> None:
        """Through the API of a node that answers (one may be stopped), else ``rabbitmqctl``; a failure is
        not the test's: ignored."""
        for node in self.nodes if self.management else []:
            with contextlib.suppress(Exception):
                node.management().delete_vhost(vhost)
                return
        with contextlib.suppress(Exception):
            self.ctl(self.running_node(), "delete_vhost", vhost)

    def running_node(self) -> Node:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                self.ctl(node, "status", timeout=20)
                return node
        raise RuntimeError("no node of the cluster is running")

    def leader(self, vhost: str, queue: str) -> Node:
        """The node that leads quorum queue ``queue`` now."""
        out = self.ctl(
            self.running_node(), "list_queues", "-p", vhost, "name", "leader", "--formatter", "json"
        )

        for row in json.loads(out):
            if row["name"] == queue:
                return self.by_name(row["leader"])
        raise AssertionError(f"queue {queue} not found in vhost {vhost}: {out}")

    def members(self, vhost: str, queue: str) -> list[str]:
        out = self.ctl(
            self.running_node(), "list_queues", "-p", vhost, "name", "members", "--formatter", "json"
        )

        for row in json.loads(out):
            if row["name"] == queue:
                return sorted(row["members"])
        raise AssertionError(f"queue {queue} not found in vhost {vhost}: {out}")

    def by_name(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise AssertionError(f"{name} is not a node of this cluster")


@contextlib.contextmanager
def private_rabbitmq(size: int, *, why: str, config: str = "") -> Iterator[RabbitCluster]:
    """``size`` private nodes (joined into one cluster when more than one), stopped and removed after; the
    test is skipped (failed under CI) when rabbitmq-server is not installed. ``why``: what they are for."""
    bin_dir = find_server()
    if bin_dir is None:
        message = f"rabbitmq-server is not installed: {why}"
        if os.environ.get("CI"):
            pytest.fail(message + " (CI must install it)")
        pytest.skip(message)
    cluster = RabbitCluster(bin_dir, size, config=config)
    try:
        yield cluster.start()
    finally:
        cluster.close()


@contextlib.asynccontextmanager
async def stack_on(
    cluster: RabbitCluster, postgres_dsn: str, redis_url: str, log_dir: Path
) -> AsyncIterator[Stack]:
    """A stack whose broker is ``cluster``: its own vhost there, a migrated database, Redis; its workers
    killed and the vhost deleted after."""
    vhost = f"ltm-test-{secrets.token_hex(4)}"
    await asyncio.to_thread(cluster.add_vhost, vhost)
    await apply_migrations(postgres_dsn)
    conn = await asyncpg.connect(postgres_dsn)
    stack = Stack(postgres_dsn, cluster.nodes[0].url(vhost), redis_url, log_dir, BotRows(conn))
    try:
        yield stack
    finally:
        for process in stack.workers:
            process.kill()
        await conn.close()
        await asyncio.to_thread(cluster.delete_vhost, vhost)


@contextlib.asynccontextmanager
async def rabbitmq_stopped(broker: RabbitCluster) -> AsyncIterator[None]:
    """The private one-node ``broker``'s app stopped (``rabbitmqctl stop_app``: every connection closed, the
    listener gone) for the body of the block; ``start_app`` after, which returns once the app has started
    and listens again. Its vhosts and durable queues survive, as on a restart."""
    (node,) = broker.nodes
    await asyncio.to_thread(broker.ctl, node, "stop_app")
    try:
        yield
    finally:
        await asyncio.to_thread(broker.ctl, node, "start_app")
