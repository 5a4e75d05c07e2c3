"""deploy/rabbitmq/definitions.json: in step with the worker's declares; its permissions hold for real.

The broker tests import the definitions into the test broker without touching its vhost `/` or its users: the
file is rewritten for a fresh vhost `ltm-deploy-<hex>` and user names suffixed `-<hex>` (password hashes kept,
so the development passwords of deploy/README.md are checked too), imported (`rabbitmqctl import_definitions`,
or the management API's `POST /api/definitions` when one answers), exercised as each user with aio-pika, and
the users and the vhost are deleted afterwards.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import hashlib
import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

import aio_pika
import aiormq.exceptions
import pytest
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue

from bench.shards import Shard as BenchShard
from contracts.models import DeadLetterKind
from contracts.models import shard_queue as shard_queue_name
from tests.factories import event_body
from tests.services import (
    RABBITMQ,
    ManagementApi,
    Services,
    ServiceUnavailable,
    amqp_credentials,
    failure,
    host_port,
    is_this_machine,
    redact,
    run_async,
    with_path,
)
from tests.support.harness import Shard as HarnessShard
from tests.support.harness import WorkerProcess
from worker.broker.envelope import RoutableIds
from worker.broker.headers import Sender
from worker.broker.publisher import Publisher
from worker.broker.topology import (
    dead_letter_queue_arguments,
    declare_topology,
    retry_queue_arguments,
    retry_queue_name,
    work_queue_arguments,
)
from worker.config import Settings, Topology, env_of
from worker.observability.metrics import Metrics
from worker.observability.sampler import Sampler
from worker.pipeline.outcome import internal_error
from worker.service.policy import RetryPolicy
from worker.store.migrate import apply_migrations
from worker.testing.dead_letters import keep_copies

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DEFINITIONS_FILE = REPO / "deploy" / "rabbitmq" / "definitions.json"
TOPOLOGY = Topology()
_DEFAULTS = Settings()
#: the retry tiers `worker run` declares with the default settings
DEFAULT_DELAYS = RetryPolicy.of(_DEFAULTS).tiers()
#: development passwords (deploy/README.md); the file holds only their hashes
DEV_PASSWORDS = {
    "shard-0": "shard-0-dev-password",
    "shard-1": "shard-1-dev-password",
    "worker": "worker-dev-password",
    "operator": "operator-dev-password",
    "keda": "keda-dev-password",
}
#: the shards the file ships users for (more come from deploy/rabbitmq/shard_users.py)
SHIPPED_SHARDS = [0, 1]
SHARD_ID = 7
#: the other shard of the confinement tests (it tries to reach SHARD_ID's queues and keys)
OTHER_SHARD = 5
#: the shard ids the broker tests add users for, with deploy/rabbitmq/shard_users.py
TEST_SHARDS = [OTHER_SHARD, SHARD_ID, SHARD_ID + 1, SHARD_ID + 2]
WAIT_SECONDS = 15.0
ADMIN_TIMEOUT = 60.0

#: a copy of an event that carried no user_id (x-ltm-user-id "")
NO_SENDER = Sender(None)


def load_script(name: str) -> ModuleType:
    """A standard-library script of deploy/rabbitmq/ (not a package), imported by path."""
    spec = importlib.util.spec_from_file_location(name, REPO / "deploy" / "rabbitmq" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


shard_users = load_script("shard_users")
#: every user's password: the file's development ones, and those of the shard users the tests add
PASSWORDS = DEV_PASSWORDS | {
    shard_users.user_name(shard): f"shard-{shard}-test-password" for shard in TEST_SHARDS
}


def load_definitions() -> dict[str, Any]:
    return json.loads(DEFINITIONS_FILE.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def with_test_shards(definitions: dict[str, Any]) -> dict[str, Any]:
    """The file plus users for TEST_SHARDS, made the way deploy/README.md tells an operator to."""
    passwords = {shard: PASSWORDS[shard_users.user_name(shard)] for shard in TEST_SHARDS}
    added = shard_users.definitions(TEST_SHARDS, "/", passwords)
    return shard_users.merge(definitions, added)  # type: ignore[no-any-return]


def shard_user(shard_id: int) -> str:
    """The user of shard `shard_id` (a key of Deployed.urls)."""
    return shard_users.user_name(shard_id)  # type: ignore[no-any-return]


#: the user of SHARD_ID, the shard of most tests
SHARD = shard_user(SHARD_ID)
#: the user of OTHER_SHARD
OTHER = shard_user(OTHER_SHARD)


def by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in items}


# --- the file against the worker's code (no broker) ------------------------------------------------------


def test_the_work_queue_carries_exactly_the_arguments_the_worker_declares() -> None:
    queue = by_name(load_definitions()["queues"])[TOPOLOGY.work_queue]
    assert queue["arguments"] == work_queue_arguments(TOPOLOGY)
    assert (queue["vhost"], queue["durable"], queue["auto_delete"]) == ("/", True, False)


def test_the_retry_queues_are_those_of_the_default_delays_with_the_worker_arguments() -> None:
    queues = by_name(load_definitions()["queues"])
    retry = {name: q for name, q in queues.items() if name.startswith(TOPOLOGY.retry_queue_prefix + ".")}
    assert DEFAULT_DELAYS == [1000, 2000, 4000, 8000]
    assert sorted(retry) == sorted(retry_queue_name(TOPOLOGY, delay) for delay in DEFAULT_DELAYS)
    for queue in retry.values():
        assert queue["arguments"] == retry_queue_arguments(TOPOLOGY)
        assert (queue["durable"], queue["auto_delete"]) == (True, False)


def test_the_file_holds_exactly_the_contract_topology() -> None:
    definitions = load_definitions()
    queues = by_name(definitions["queues"])
    assert queues[TOPOLOGY.dead_letter_queue]["arguments"] == dead_letter_queue_arguments()
    assert queues[TOPOLOGY.dead_letter_copies_queue]["arguments"] == dead_letter_queue_arguments()
    assert len(queues) == 3 + len(DEFAULT_DELAYS)
    exchanges = by_name(definitions["exchanges"])
    assert sorted(exchanges) == sorted(
        [
            TOPOLOGY.tool_calls_exchange,
            TOPOLOGY.results_exchange,
            TOPOLOGY.notifications_exchange,
            TOPOLOGY.dead_letter_exchange,
        ]
    )
    for exchange in exchanges.values():
        assert (exchange["type"], exchange["durable"], exchange["auto_delete"]) == ("topic", True, False)
    assert binding_set(definitions) == expected_bindings()
    assert {entry["vhost"] for key in ("queues", "exchanges", "bindings") for entry in definitions[key]} == {
        "/"
    }


def test_the_password_hashes_are_rabbitmq_sha256_hashes_of_the_development_passwords() -> None:
    users = by_name(load_definitions()["users"])
    assert sorted(users) == sorted(DEV_PASSWORDS)
    for name, user in users.items():
        assert user["hashing_algorithm"] == "rabbit_password_hashing_sha256"
        raw = base64.b64decode(user["password_hash"])
        salt, digest = raw[:4], raw[4:]
        assert digest == hashlib.sha256(salt + DEV_PASSWORDS[name].encode()).digest(), name


def test_the_shipped_shard_users_are_what_shard_users_py_makes() -> None:
    """The file's shard users have exactly the permissions the script gives an operator's shards."""
    definitions = load_definitions()
    for shard_id in SHIPPED_SHARDS:
        name = shard_users.user_name(shard_id)
        (grant,) = [p for p in definitions["permissions"] if p["user"] == name]
        assert grant == {"user": name, "vhost": "/", **shard_users.permissions(shard_id)}
        topics = [t for t in definitions["topic_permissions"] if t["user"] == name]
        assert topics == [{"user": name, "vhost": "/", **t} for t in shard_users.topic_permissions(shard_id)]
    assert not [u for u in definitions["users"] if u["name"] == "bot"], "the shared bot user is gone"


def test_shard_users_py_merges_and_prints_commands() -> None:
    """`--merge` replaces a user's entries instead of repeating them; `commands` quotes every regex."""
    once = shard_users.merge(load_definitions(), shard_users.definitions([0, 4], "/", {0: "a", 4: "b"}))
    twice = shard_users.merge(once, shard_users.definitions([4], "/", {4: "c"}))
    assert [u["name"] for u in twice["users"]].count("shard-4") == 1
    assert [t["user"] for t in twice["topic_permissions"]].count("shard-4") == 3
    assert [p["user"] for p in twice["permissions"]].count("shard-0") == 1
    assert shard_users.shard_ids(["0-2", "5", "1"]) == [0, 1, 2, 5]
    lines = shard_users.commands([12], "/tomori")
    assert lines[0] == 'rabbitmqctl add_user shard-12 "${SHARD_12_PASSWORD:?}"'
    assert lines[1] == 'rabbitmqctl set_user_limits shard-12 \'{"max-connections": 4, "max-channels": 16}\''
    assert lines[2] == (
        "rabbitmqctl set_permissions -p /tomori shard-12 '^tomori\\.shard\\.12\\.(results|notifications)$' "
        "'^(tomori\\.tool_calls|tomori\\.shard\\.12\\.(results|notifications))$' "
        "'^(tomori\\.(tool_results|notifications)|tomori\\.shard\\.12\\.(results|notifications))$'"
    )
    assert (
        lines[3] == "rabbitmqctl set_topic_permissions -p /tomori shard-12 tomori.tool_calls "
        "'^tool\\.[A-Za-z0-9_]+(\\.shard\\.12)?$' '^$'"
    )
    assert (
        lines[4]
        == "rabbitmqctl set_topic_permissions -p /tomori shard-12 tomori.tool_results '^$' '^shard\\.12$'"
    )


def binding_set(definitions: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(b["source"], b["destination"], b["routing_key"]) for b in definitions["bindings"]}


def expected_bindings() -> set[tuple[str, str, str]]:
    work = {(TOPOLOGY.tool_calls_exchange, TOPOLOGY.work_queue, key) for key in TOPOLOGY.routing_keys}
    dead = {TOPOLOGY.dead_letter_queue, TOPOLOGY.dead_letter_copies_queue}
    return work | {(TOPOLOGY.dead_letter_exchange, queue, "#") for queue in dead}


# --- importing into a throw-away vhost ------------------------------------------------------------------


def isolated(definitions: dict[str, Any], vhost: str, suffix: str) -> dict[str, Any]:
    """The definitions moved to `vhost`, every user renamed `<name>-<suffix>` (hashes kept)."""
    moved = copy.deepcopy(definitions)
    moved["vhosts"] = [{"name": vhost}]
    for user in moved["users"]:
        user["name"] = f"{user['name']}-{suffix}"
    for key in (
        "permissions",
        "topic_permissions",
        "policies",
        "parameters",
        "queues",
        "exchanges",
        "bindings",
    ):
        for entry in moved.get(key, []):
            entry["vhost"] = vhost
            if "user" in entry:
                entry["user"] = f"{entry['user']}-{suffix}"
    return moved


class BrokerAdmin(Protocol):
    """What the test needs beyond AMQP: import definitions, look at the result, delete users and vhosts."""

    def import_definitions(self, definitions: dict[str, Any]) -> None: ...

    def bindings(self, vhost: str) -> set[tuple[str, str, str]]: ...

    def queue_policies(self, vhost: str) -> dict[str, str]: ...

    def delete_user(self, name: str) -> None: ...

    def delete_vhost(self, name: str) -> None: ...


@dataclass(frozen=True)
class RabbitmqctlAdmin:
    """`rabbitmqctl` on the broker's own machine (this machine's broker has no management plugin)."""

    executable: str

    def _run(self, *args: str) -> str:
        done = subprocess.run(
            [self.executable, *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=ADMIN_TIMEOUT,
            check=False,
        )
        if done.returncode != 0:
            output = (done.stdout + done.stderr).strip()
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} exited {done.returncode}: {output}")
        return done.stdout

    def _rows(self, *args: str) -> list[list[str]]:
        lines = self._run(*args, "--quiet", "--no-table-headers").splitlines()
        return [line.split("\t") for line in lines if line.strip()]

    def import_definitions(self, definitions: dict[str, Any]) -> None:
        with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="ltm-deploy-") as file:
            json.dump(definitions, file)
            file.flush()
            # the CLI may run as the broker's user: it must be able to read the file (hashes only)
            os.chmod(file.name, 0o644)
            self._run("import_definitions", file.name)

    def bindings(self, vhost: str) -> set[tuple[str, str, str]]:
        rows = self._rows("list_bindings", "-p", vhost, "source_name", "destination_name", "routing_key")
        return {(row[0], row[1], row[2]) for row in rows if len(row) == 3 and row[0]}

    def queue_policies(self, vhost: str) -> dict[str, str]:
        rows = self._rows("list_queues", "-p", vhost, "name", "policy")
        return {row[0]: row[1] if len(row) > 1 else "" for row in rows}

    def delete_user(self, name: str) -> None:
        self._run_tolerating_absence("delete_user", name)

    def delete_vhost(self, name: str) -> None:
        self._run_tolerating_absence("delete_vhost", name)

    def _run_tolerating_absence(self, *args: str) -> None:
        try:
            self._run(*args)
        except RuntimeError as error:
            text = str(error).lower()
            if not any(gone in text for gone in ("does not exist", "does_not_exist", "not found", "no_such")):
                raise


@dataclass(frozen=True)
class ManagementAdmin:
    """The management HTTP API (a broker in a container, or one with the plugin enabled)."""

    api: ManagementApi

    def _call(self, method: str, path: str, body: object | None = None) -> Any:
        return self.api.call(method, path.removeprefix("/api"), body, timeout=ADMIN_TIMEOUT)

    def import_definitions(self, definitions: dict[str, Any]) -> None:
        self._call("POST", "/api/definitions", definitions)

    def bindings(self, vhost: str) -> set[tuple[str, str, str]]:
        rows = self._call("GET", f"/api/bindings/{quote(vhost, safe='')}")
        return {(r["source"], r["destination"], r["routing_key"]) for r in rows if r["source"]}

    def queue_policies(self, vhost: str) -> dict[str, str]:
        rows = self._call("GET", f"/api/queues/{quote(vhost, safe='')}")
        return {row["name"]: row.get("policy") or "" for row in rows}

    def delete_user(self, name: str) -> None:
        self._delete(f"/api/users/{quote(name, safe='')}")

    def delete_vhost(self, name: str) -> None:
        self._delete(f"/api/vhosts/{quote(name, safe='')}")

    def _delete(self, path: str) -> None:
        try:
            self._call("DELETE", path)
        except urllib.error.HTTPError as error:
            if error.code != 404:
                raise


def broker_admin(url: str, management_url: str | None) -> BrokerAdmin:
    user, password = amqp_credentials(url)
    host = urlsplit(url).hostname or "localhost"
    api = ManagementApi.from_url(management_url or f"http://{host_port(host, 15672)}", user, password)
    if api.answers():
        return ManagementAdmin(api)
    executable = shutil.which("rabbitmqctl")
    if executable and is_this_machine(host):
        return RabbitmqctlAdmin(executable)
    raise ServiceUnavailable(
        f"RabbitMQ at {redact(url)}: importing definitions needs the management API (none answered at "
        f"{api.base_url}) or rabbitmqctl on the broker's own machine"
    )


@dataclass(frozen=True)
class Deployed:
    """The definitions imported into a throw-away vhost: an AMQP URL per user of the file."""

    vhost: str
    urls: dict[str, str]
    admin: BrokerAdmin

    @contextlib.asynccontextmanager
    async def connect(self, user: str) -> AsyncIterator[aio_pika.abc.AbstractConnection]:
        connection = await aio_pika.connect(self.urls[user], timeout=10)
        try:
            yield connection
        finally:
            await connection.close()


def amqp_urls(url: str, vhost: str, suffix: str) -> dict[str, str]:
    """The AMQP URL of each user of the file, renamed with `suffix`, on `vhost` of the broker at `url`."""
    parts = urlsplit(url)
    address = parts.netloc.rpartition("@")[2]
    urls = {}
    for name, password in PASSWORDS.items():
        credentials = f"{quote(f'{name}-{suffix}', safe='')}:{quote(password, safe='')}"
        urls[name] = with_path(parts._replace(netloc=f"{credentials}@{address}").geturl(), "/" + quote(vhost))
    return urls


async def every_user_connects(deployed: Deployed) -> bool:
    for user in deployed.urls:
        try:
            async with deployed.connect(user):
                pass
        except Exception:  # not imported yet: the user, or its permission on the vhost
            return False
    return True


@contextlib.contextmanager
def imported(test_services: Services, *, with_topology: bool) -> Iterator[Deployed]:
    """definitions.json in `ltm-deploy-<hex>` with users `<name>-<hex>`; without its exchanges, queues and
    bindings when not `with_topology` (a broker that never loaded the file). Deleted again on exit."""
    try:
        endpoint = test_services.resolve(RABBITMQ)
        admin = broker_admin(endpoint.url, endpoint.management_url)
    except ServiceUnavailable as error:
        raise failure(error) from None
    suffix = secrets.token_hex(4)
    vhost = f"ltm-deploy-{suffix}"
    definitions = isolated(with_test_shards(load_definitions()), vhost, suffix)
    if not with_topology:
        for key in ("exchanges", "queues", "bindings"):
            definitions[key] = []
    deployed = Deployed(vhost, amqp_urls(endpoint.url, vhost, suffix), admin)
    try:
        admin.import_definitions(definitions)
        # rabbitmqctl's import is asynchronous: wait for the users, then the bindings (created last)
        deadline = time.monotonic() + WAIT_SECONDS
        while not run_async(every_user_connects(deployed)) or (
            with_topology and admin.bindings(vhost) != expected_bindings()
        ):
            assert time.monotonic() < deadline, f"the import into {vhost} did not complete"
            time.sleep(0.2)
        yield deployed
    finally:
        for user in definitions["users"]:
            with contextlib.suppress(Exception):
                admin.delete_user(user["name"])
        admin.delete_vhost(vhost)


@pytest.fixture(scope="module")
def deployed(test_services: Services) -> Iterator[Deployed]:
    """The whole file, imported once for the module."""
    with imported(test_services, with_topology=True) as deployed:
        yield deployed


# --- helpers -----------------------------------------------------------------------------------------------


async def get_one(queue: AbstractQueue, *, no_ack: bool = False) -> AbstractIncomingMessage:
    """The next message of `queue` (basic.get), waiting up to WAIT_SECONDS."""
    deadline = time.monotonic() + WAIT_SECONDS
    while (message := await queue.get(fail=False, no_ack=no_ack)) is None:
        assert time.monotonic() < deadline, f"nothing arrived in {queue.name}"
        await asyncio.sleep(0.05)
    return message


def shard_queue(kind: str) -> str:
    return f"tomori.shard.{SHARD_ID}.{kind}"


async def bind_shard_queue(channel: AbstractChannel, kind: str, exchange: str) -> AbstractQueue:
    queue = await channel.declare_queue(shard_queue(kind), durable=True)
    await queue.bind(exchange, routing_key=f"shard.{SHARD_ID}")
    return queue


# --- what each user may do ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_import_applies_the_work_queue_policy(deployed: Deployed) -> None:
    # the management API lists a queue's policy from its statistics, refreshed every few seconds: wait for it
    deadline = time.monotonic() + WAIT_SECONDS
    policies = deployed.admin.queue_policies(deployed.vhost)
    while policies.get(TOPOLOGY.work_queue) != "ltm-work-queue-bounds" and time.monotonic() < deadline:
        time.sleep(0.5)
        policies = deployed.admin.queue_policies(deployed.vhost)
    assert policies[TOPOLOGY.work_queue] == "ltm-work-queue-bounds"
    assert policies[TOPOLOGY.dead_letter_queue] == ""


async def test_each_user_does_its_part_of_a_round_trip(deployed: Deployed) -> None:
    """worker run's start-up and publishes, a shard's publish and consume, worker dlq list and replay."""
    async with (
        deployed.connect("worker") as worker,
        deployed.connect(SHARD) as bot,
        deployed.connect("operator") as operator,
    ):
        # worker run: the start-up declares (PRECONDITION_FAILED here if the file's arguments drifted)
        publish_channel = await worker.channel(publisher_confirms=True, on_return_raises=True)
        declared = await declare_topology(publish_channel, TOPOLOGY, DEFAULT_DELAYS)
        publisher = Publisher.for_topology(publish_channel, declared)
        consume_channel = await worker.channel()
        await consume_channel.set_qos(prefetch_count=8)
        work = await consume_channel.declare_queue(
            TOPOLOGY.work_queue, durable=True, arguments=work_queue_arguments(TOPOLOGY)
        )
        deliveries: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        await work.consume(deliveries.put)

        # a shard: its own result and notice queues, then a tool call
        bot_channel = await bot.channel(publisher_confirms=True, on_return_raises=True)
        results = await bind_shard_queue(bot_channel, "results", TOPOLOGY.results_exchange)
        notices = await bind_shard_queue(bot_channel, "notifications", TOPOLOGY.notifications_exchange)
        tool_calls = await bot_channel.get_exchange(TOPOLOGY.tool_calls_exchange, ensure=False)
        event_id = str(uuid.uuid4())
        await tool_calls.publish(
            aio_pika.Message(b'{"deploy": true}', message_id=event_id),
            TOPOLOGY.routing_keys[0],
            mandatory=True,
        )

        # the worker answers, retries once through the default exchange, then dead-letters
        message = await asyncio.wait_for(deliveries.get(), WAIT_SECONDS)
        assert message.message_id == event_id
        await publisher.publish_outputs(
            event_id=event_id,
            tool_call_id="call_1",
            shard_id=SHARD_ID,
            result=internal_error(DeadLetterKind.INTERNAL).result(
                RoutableIds(uuid.UUID(event_id), "call_1", SHARD_ID, "create_long_term_memory"),
                datetime.now(UTC),
            ),
            notification={"event_id": event_id},
            traceparent=None,
        )
        await publisher.retry_later(
            message,
            queue=retry_queue_name(TOPOLOGY, DEFAULT_DELAYS[0]),
            attempts=1,
            delay_ms=50,
            sender=NO_SENDER,
        )
        await message.ack()
        again = await asyncio.wait_for(deliveries.get(), WAIT_SECONDS)
        assert (again.message_id, again.headers["x-ltm-attempts"]) == (event_id, 1)
        await publisher.dead_letter(again, kind="internal", error="deploy test", attempts=2, sender=NO_SENDER)
        await again.ack()

        assert json.loads((await get_one(results, no_ack=True)).body)["event_id"] == event_id
        assert json.loads((await get_one(notices, no_ack=True)).body)["event_id"] == event_id

        # worker dlq list / show as the worker user: read and put back
        dlq = await publish_channel.get_queue(TOPOLOGY.dead_letter_queue, ensure=False)
        letter = await get_one(dlq)
        assert letter.headers["x-ltm-error-kind"] == "internal"
        await letter.nack(requeue=True)

        # worker dlq replay as the operator: take the dead letter, publish it to tomori.tool_calls
        operator_channel = await operator.channel(publisher_confirms=True, on_return_raises=True)
        await declare_topology(operator_channel, TOPOLOGY, DEFAULT_DELAYS)
        letter = await get_one(await operator_channel.get_queue(TOPOLOGY.dead_letter_queue, ensure=False))
        replay_to = await operator_channel.get_exchange(TOPOLOGY.tool_calls_exchange, ensure=False)
        await replay_to.publish(
            aio_pika.Message(letter.body, message_id=letter.message_id),
            letter.routing_key or "",
            mandatory=True,
        )
        await letter.ack()
        replayed = await asyncio.wait_for(deliveries.get(), WAIT_SECONDS)
        assert replayed.message_id == event_id
        await replayed.ack()


async def test_the_worker_user_may_declare_retry_tiers_beyond_the_defaults(deployed: Deployed) -> None:
    """Other LTM_RETRY_* settings mean other tiers: the worker declares them itself."""
    async with deployed.connect("worker") as worker:
        channel = await worker.channel()
        await declare_topology(channel, TOPOLOGY, [*DEFAULT_DELAYS, 16000, 60000])


async def test_the_worker_user_may_create_the_whole_topology_on_a_broker_without_it(
    test_services: Services,
) -> None:
    """A broker that never loaded the file (or lost the queues): `worker run` creates everything itself.

    Creating a queue with a dead-letter exchange also needs read on the queue and write on that exchange
    (`amq.default` for the retry queues), which re-declaring an existing queue does not check.
    """
    with imported(test_services, with_topology=False) as empty:
        async with empty.connect("worker") as worker:
            channel = await worker.channel()
            await declare_topology(channel, TOPOLOGY, DEFAULT_DELAYS)
        assert empty.admin.bindings(empty.vhost) == expected_bindings()


async def test_worker_run_consumes_and_dead_letters_as_the_worker_user(
    test_services: Services, migrated_dsn: str, redis_url: str, tmp_path: Path
) -> None:
    """The real `worker run` process, connected as `worker`: start-up declares, consume, a result and notice
    to a shard connected as its own user, a DLQ publish, stop."""
    with imported(test_services, with_topology=True) as deployed:
        env = {key: value for key, value in os.environ.items() if not key.startswith("LTM_")}
        env |= env_of(
            rabbitmq_url=deployed.urls["worker"],
            postgres_dsn=migrated_dsn,
            redis_url=redis_url,
            log_format="json",
        )
        process = WorkerProcess(env, tmp_path / "worker.log").start()
        try:
            await process.wait_for_log("consuming", timeout=WAIT_SECONDS * 2)
            # a shard, as its own user: declares and binds its queues, publishes an event, gets the answer
            # (published by the worker as `worker`, mandatory and confirmed)
            async with HarnessShard(deployed.urls[SHARD], SHARD_ID, declare_exchanges=False) as shard:
                body = event_body({"memory_content": "x", "memory_scope": "server_wide"}, persona_id=1)
                body["shard_id"] = SHARD_ID
                await shard.publish(body)
                await shard.wait_for_results([body["event_id"]], timeout=WAIT_SECONDS * 2)
            async with deployed.connect(SHARD) as bot, deployed.connect("operator") as operator:
                channel = await bot.channel(publisher_confirms=True, on_return_raises=True)
                tool_calls = await channel.get_exchange(TOPOLOGY.tool_calls_exchange, ensure=False)
                await tool_calls.publish(
                    aio_pika.Message(b"not json"), TOPOLOGY.routing_keys[0], mandatory=True
                )
                operator_channel = await operator.channel()
                dlq = await operator_channel.get_queue(TOPOLOGY.dead_letter_queue, ensure=False)
                letter = await get_one(dlq, no_ack=True)
            assert (letter.body, letter.headers["x-ltm-error-kind"]) == (b"not json", "malformed")
            process.signal(signal.SIGTERM)
            assert await process.wait_exit(WAIT_SECONDS) == 0
        finally:
            process.kill()


async def test_worker_demo_send_as_the_shipped_shard_0_user_gets_its_save_answered(
    test_services: Services, migrated_dsn: str, redis_url: str, tmp_path: Path
) -> None:
    """deploy/README.md's first save through the compose stack: `worker demo send --shard 0` with the
    definitions' own `shard-0` (newcomer review 4, F9: shard 3 has no user there). Everything `send` does
    (passive checks, its two queues declared and bound, the publish with `user_id`, `basic.get`) is within
    what a shard user may; the broker accepts `user_id` only as the connection's user."""
    with imported(test_services, with_topology=True) as deployed:
        env = {key: value for key, value in os.environ.items() if not key.startswith("LTM_")}
        env |= env_of(
            rabbitmq_url=deployed.urls["worker"],
            postgres_dsn=migrated_dsn,
            redis_url=redis_url,
            log_format="json",
            # the shipped manifests' identity check, with the users renamed `<name>-<suffix>` here
            shard_identity="required",
            shard_user="shard-{shard_id}-" + deployed.vhost.removeprefix("ltm-deploy-"),
        )
        seeded = await asyncio.to_thread(worker_demo, env, "seed")
        assert seeded.returncode == 0, seeded.stdout + seeded.stderr
        process = WorkerProcess(env, tmp_path / "worker.log").start()
        try:
            await process.wait_for_log("consuming", timeout=WAIT_SECONDS * 2)
            sent = await asyncio.to_thread(
                worker_demo, env, "send", "--shard", "0", "--rabbitmq-url", deployed.urls[shard_user(0)]
            )
            assert sent.returncode == 0, sent.stdout + sent.stderr
            assert "result: memory_saved_successfully" in sent.stdout
            assert "notice: 🧠 Tomori Learned Something New! - Kaede likes dogs" in sent.stdout
            process.signal(signal.SIGTERM)
            assert await process.wait_exit(WAIT_SECONDS) == 0
        finally:
            process.kill()


def worker_demo(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m worker demo ARGS` with `env` (blocking)."""
    return subprocess.run(
        [sys.executable, "-m", "worker", "demo", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT_SECONDS * 4,
        check=False,
    )


async def worker_dlq(deployed: Deployed, user: str, *args: str, audit: str | None = None) -> tuple[int, str]:
    """`python -m worker dlq ARGS` connected as `user`: (exit code, stdout + stderr). ``audit``: the database
    of the audit record (replay and purge refuse to run without one)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("LTM_")}
    if audit is not None:
        env["LTM_POSTGRES_DSN"] = audit
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "worker",
        "dlq",
        *args,
        "--rabbitmq-url",
        deployed.urls[user],
        cwd=REPO,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), WAIT_SECONDS * 4)
    assert process.returncode is not None
    return process.returncode, output.decode(errors="replace")


@pytest.mark.slow
async def test_worker_dlq_runs_as_the_operator_and_replay_needs_it(test_services: Services) -> None:
    """`worker dlq list` works as worker or operator (the letters kept by a keeper that runs as the worker
    user); `replay` and `purge` as the operator. The worker user cannot replay (it may not publish to
    tomori.tool_calls): the dead letter stays in the DLQ."""
    with imported(test_services, with_topology=True) as deployed:
        event_ids = [f"dlq-{secrets.token_hex(4)}" for _ in range(2)]
        async with test_services.fresh_database() as audit, deployed.connect("worker") as worker:
            await apply_migrations(audit)
            channel = await worker.channel(publisher_confirms=True, on_return_raises=True)
            dead_letter = await channel.get_exchange(TOPOLOGY.dead_letter_exchange, ensure=False)
            for event_id in event_ids:
                headers: dict[str, Any] = {
                    "x-ltm-error": "deploy test",
                    "x-ltm-error-kind": "internal",
                    "x-ltm-attempts": 1,
                }
                body = json.dumps({"event_id": event_id, "shard_id": SHARD_ID}).encode()
                message = aio_pika.Message(body, message_id=event_id, headers=headers)
                await dead_letter.publish(message, TOPOLOGY.routing_keys[0], mandatory=True)

            # kept as a worker keeps them, as the worker user: its grants let it drain the copies queue
            assert await keep_copies(deployed.urls["worker"], audit) == 2
            for user in ("worker", "operator"):
                code, output = await worker_dlq(deployed, user, "list", "--json", audit=audit)
                assert code == 0, output
                listed = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
                assert sorted(item["event_id"] for item in listed) == sorted(event_ids), user

            code, output = await worker_dlq(
                deployed, "worker", "replay", "--event-id", event_ids[0], audit=audit
            )
            assert code != 0, output
            assert "ACCESS_REFUSED" in output
            code, output = await worker_dlq(
                deployed, "operator", "replay", "--event-id", event_ids[0], audit=audit
            )
            assert code == 0, output
            replayed = await get_one(await channel.get_queue(TOPOLOGY.work_queue, ensure=False), no_ack=True)
            assert replayed.message_id == event_ids[0]

            code, output = await worker_dlq(deployed, "operator", "purge", "--yes", audit=audit)
            assert code == 0, output
            dlq = await channel.declare_queue(TOPOLOGY.dead_letter_queue, passive=True)
            assert dlq.declaration_result.message_count == 0


async def test_keda_may_read_the_work_queue_depth(deployed: Deployed) -> None:
    """KEDA's rabbitmq scaler (protocol amqp) reads the depth with a passive declare."""
    async with deployed.connect("keda") as keda:
        channel = await keda.channel()
        queue = await channel.declare_queue(TOPOLOGY.work_queue, passive=True)
        assert queue.declaration_result.message_count is not None


async def test_the_worker_user_may_sample_every_queue_for_metrics(deployed: Deployed) -> None:
    """The metrics sampler of `worker run` passively declares every queue it reports, as `worker`."""
    queues = [
        TOPOLOGY.work_queue,
        *[retry_queue_name(TOPOLOGY, delay) for delay in RetryPolicy().tiers()],  # the defaults
        TOPOLOGY.dead_letter_queue,
    ]

    async def no_check() -> None:
        return None

    metrics = Metrics()
    sampler = Sampler(deployed.urls["worker"], queues, metrics, no_check)
    try:
        await sampler.sample_once()
    finally:
        await sampler.close()
    sampled = {
        sample.labels["queue"] for family in metrics.queue_messages.collect() for sample in family.samples
    }
    assert sampled == set(queues)


Action = Callable[[AbstractChannel], Awaitable[object]]


def publish(exchange: str, routing_key: str) -> Action:
    async def action(channel: AbstractChannel) -> object:
        target = await channel.get_exchange(exchange, ensure=False) if exchange else channel.default_exchange
        return await target.publish(aio_pika.Message(b"{}"), routing_key)

    return action


async def ignore(message: AbstractIncomingMessage) -> None:
    """A consumer callback; the refused consumes never call it."""


def consume(queue: str) -> Action:
    async def action(channel: AbstractChannel) -> object:
        target = await channel.get_queue(queue, ensure=False)
        return await target.consume(ignore)

    return action


def declare_queue(queue: str, arguments: dict[str, Any] | None = None) -> Action:
    async def action(channel: AbstractChannel) -> object:
        return await channel.declare_queue(queue, durable=True, arguments=arguments)

    return action


def bind_own_queue(exchange: str, routing_key: str) -> Action:
    async def action(channel: AbstractChannel) -> object:
        queue = await channel.declare_queue(shard_queue("results"), durable=True)
        return await queue.bind(exchange, routing_key=routing_key)

    return action


def declare_exchange(name: str) -> Action:
    async def action(channel: AbstractChannel) -> object:
        return await channel.declare_exchange(name, aio_pika.ExchangeType.TOPIC, durable=True)

    return action


def bind_work_queue(routing_key: str) -> Action:
    async def action(channel: AbstractChannel) -> object:
        queue = await channel.get_queue(TOPOLOGY.work_queue, ensure=False)
        return await queue.bind(TOPOLOGY.tool_calls_exchange, routing_key=routing_key)

    return action


def get_from(queue: str) -> Action:
    async def action(channel: AbstractChannel) -> object:
        return await (await channel.get_queue(queue, ensure=False)).get(fail=False)

    return action


REFUSED: list[tuple[str, str, Action]] = [
    (
        "worker",
        "publish to tomori.tool_calls",
        publish(TOPOLOGY.tool_calls_exchange, TOPOLOGY.routing_keys[0]),
    ),
    ("worker", "publish a result off the shard.<id> keys", publish(TOPOLOGY.results_exchange, "everyone")),
    ("worker", "declare a shard's queue", declare_queue(shard_queue("results"))),
    (SHARD, "consume ltm.create_memory", consume(TOPOLOGY.work_queue)),
    (
        SHARD,
        "declare ltm.create_memory",
        declare_queue(TOPOLOGY.work_queue, work_queue_arguments(TOPOLOGY)),
    ),
    (SHARD, "consume the DLQ", consume(TOPOLOGY.dead_letter_queue)),
    (SHARD, "publish a forged result", publish(TOPOLOGY.results_exchange, f"shard.{SHARD_ID}")),
    (SHARD, "publish a tool call off the tool.<name> keys", publish(TOPOLOGY.tool_calls_exchange, "shard.1")),
    (SHARD, "bind its queue to every shard's results", bind_own_queue(TOPOLOGY.results_exchange, "#")),
    (SHARD, "bind its queue to tomori.tool_calls", bind_own_queue(TOPOLOGY.tool_calls_exchange, "#")),
    (SHARD, "publish through the default exchange", publish("", TOPOLOGY.work_queue)),
    (SHARD, "declare a queue of another name", declare_queue("evil")),
    (SHARD, "declare a server-named queue", declare_queue("")),
    (SHARD, "declare an exchange", declare_exchange("evil.x")),
    (
        SHARD,
        "bind its queue to every shard's results with shard.*",
        bind_own_queue(TOPOLOGY.results_exchange, "shard.*"),
    ),
    ("worker", "bind the work queue to every tool's calls", bind_work_queue("#")),
    ("worker", "read a shard's results", get_from(shard_queue("results"))),
    ("operator", "bind the work queue to every tool's calls", bind_work_queue("#")),
    ("operator", "consume ltm.create_memory", consume(TOPOLOGY.work_queue)),
    ("operator", "publish a result", publish(TOPOLOGY.results_exchange, f"shard.{SHARD_ID}")),
    ("keda", "consume ltm.create_memory", consume(TOPOLOGY.work_queue)),
    ("keda", "publish to tomori.tool_calls", publish(TOPOLOGY.tool_calls_exchange, TOPOLOGY.routing_keys[0])),
]


@pytest.mark.parametrize(
    ("user", "action"),
    [pytest.param(user, action, id=f"{user} may not {what}") for user, what, action in REFUSED],
)
async def test_a_user_is_refused_what_it_does_not_need(deployed: Deployed, user: str, action: Action) -> None:
    await shard_queues_exist(deployed, SHARD_ID)  # so a refusal is the permission, not a missing queue
    async with deployed.connect(user) as connection:
        channel = await connection.channel(publisher_confirms=True)
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await action(channel)


async def test_the_shard_simulations_need_only_what_a_shard_user_may(deployed: Deployed) -> None:
    """`python -m bench`'s shards and the e2e harness's shard, each connected as its shard's user: each
    checks the exchanges, declares and binds its own `tomori.shard.<id>.*` queues, and receives what the
    worker routes to it."""
    bench_id, harness_id = SHARD_ID + 1, SHARD_ID + 2
    bench = BenchShard(bench_id, deployed.urls[shard_user(bench_id)])
    async with deployed.connect("worker") as worker:
        results = await (await worker.channel(publisher_confirms=True, on_return_raises=True)).get_exchange(
            TOPOLOGY.results_exchange, ensure=False
        )
        try:
            await bench.open(TOPOLOGY)
            # mandatory: an unbound shard queue would make this publish come back as unroutable
            message = aio_pika.Message(b'{"event_id": "bench"}')
            await results.publish(message, f"shard.{bench_id}", mandatory=True)
        finally:
            await bench.close()

        async with HarnessShard(
            deployed.urls[shard_user(harness_id)], harness_id, declare_exchanges=False
        ) as shard:
            await shard.publish(event_body({}, persona_id=1), routing_key="tool.not_bound_here")
            await results.publish(
                aio_pika.Message(b'{"event_id": "harness"}'), f"shard.{harness_id}", mandatory=True
            )
            await shard.wait_for_results(["harness"], timeout=WAIT_SECONDS)

    async with deployed.connect(shard_user(bench_id)) as bot:
        channel = await bot.channel()
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
            await channel.get_queue(shard_queue_name(bench_id, "results"))  # the bench deletes its queues
    async with deployed.connect(shard_user(harness_id)) as bot:
        channel = await bot.channel()
        for kind in ("results", "notifications"):
            # the harness leaves its own, as a shard does over a restart; its user may delete them
            await (await channel.get_queue(shard_queue_name(harness_id, kind))).delete()


# --- security review 3, section 4: every row, before and after per-shard users ------------------------------
#
# Before, every shard connected as the one `bot` user, whose regexes matched every shard's queues and keys.
# Now shard N connects as `shard-N` (deploy/rabbitmq/shard_users.py). OTHER_SHARD plays the shard that reaches
# for SHARD_ID's traffic; SHARD_ID's queues are declared by its own user first.


async def shard_queues_exist(deployed: Deployed, shard_id: int) -> None:
    """The shard's two queues, declared and bound by its own user as CONTRACT.md section 2 says."""
    async with deployed.connect(shard_user(shard_id)) as connection:
        channel = await connection.channel()
        for kind, exchange in (
            ("results", TOPOLOGY.results_exchange),
            ("notifications", TOPOLOGY.notifications_exchange),
        ):
            queue = await channel.declare_queue(shard_queue_name(shard_id, kind), durable=True)
            await queue.bind(exchange, routing_key=f"shard.{shard_id}")


async def queue_depth(deployed: Deployed, name: str) -> int:
    async with deployed.connect("worker") as connection:
        channel = await connection.channel()
        declared = await channel.declare_queue(name, passive=True)
        return declared.declaration_result.message_count or 0


async def publish_to_shard(deployed: Deployed, shard_id: int, body: bytes) -> None:
    """A result and a notice for `shard_id`, as the worker publishes them (mandatory, confirmed)."""
    async with deployed.connect("worker") as connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        for name in (TOPOLOGY.results_exchange, TOPOLOGY.notifications_exchange):
            exchange = await channel.get_exchange(name, ensure=False)
            await exchange.publish(aio_pika.Message(body), f"shard.{shard_id}", mandatory=True)


async def is_refused(deployed: Deployed, user: str, action: Action) -> bool:
    """Whether `user` gets ACCESS_REFUSED doing `action` (on a channel of its own: a refusal closes it)."""
    async with deployed.connect(user) as connection:
        channel = await connection.channel(publisher_confirms=True)
        try:
            await action(channel)
        except aiormq.exceptions.ChannelAccessRefused:
            return True
        return False


def bind_queue(queue: str, exchange: str, routing_key: str) -> Action:
    async def action(channel: AbstractChannel) -> object:
        return await (await channel.get_queue(queue, ensure=False)).bind(exchange, routing_key=routing_key)

    return action


def purge(queue: str) -> Action:
    async def action(channel: AbstractChannel) -> object:
        return await (await channel.get_queue(queue, ensure=False)).purge()

    return action


def delete(queue: str) -> Action:
    async def action(channel: AbstractChannel) -> object:
        return await channel.queue_delete(queue)

    return action


def bind_exchange(destination: str, source: str, routing_key: str) -> Action:
    async def action(channel: AbstractChannel) -> object:
        target = await channel.get_exchange(destination, ensure=False)
        return await target.bind(source, routing_key=routing_key)

    return action


async def test_a_shard_does_everything_the_contract_asks_with_its_own_queues(deployed: Deployed) -> None:
    """Allowed, as `shard-N`: declare (classic or quorum), bind with `shard.N`, consume, get, purge, unbind,
    delete and declare again its own queues; publish a tool call (mandatory, confirmed)."""
    own = OTHER_SHARD
    results, notices = (shard_queue_name(own, kind) for kind in ("results", "notifications"))
    async with deployed.connect(OTHER) as connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        result_queue = await channel.declare_queue(results, durable=True)
        notice_queue = await channel.declare_queue(
            notices, durable=True, arguments={"x-queue-type": "quorum"}
        )
        await result_queue.bind(TOPOLOGY.results_exchange, routing_key=f"shard.{own}")
        await notice_queue.bind(TOPOLOGY.notifications_exchange, routing_key=f"shard.{own}")

        await publish_to_shard(deployed, own, b'{"event_id": "own-1"}')
        assert (await get_one(result_queue)).body == b'{"event_id": "own-1"}'
        got: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        tag = await notice_queue.consume(got.put, no_ack=True)
        assert (await asyncio.wait_for(got.get(), WAIT_SECONDS)).body == b'{"event_id": "own-1"}'
        await notice_queue.cancel(tag)

        await publish_to_shard(deployed, own, b'{"event_id": "own-2"}')
        await result_queue.purge()
        await result_queue.unbind(TOPOLOGY.results_exchange, routing_key=f"shard.{own}")
        await result_queue.delete(if_unused=False, if_empty=False)
        await notice_queue.delete(if_unused=False, if_empty=False)
        await channel.declare_queue(results, durable=True)  # declared again after a delete
        await channel.queue_delete(results)

        event_id = str(uuid.uuid4())
        tool_calls = await channel.get_exchange(TOPOLOGY.tool_calls_exchange, ensure=False)
        body = json.dumps(event_body({}, persona_id=1, event_id=event_id, shard_id=own)).encode()
        await tool_calls.publish(
            aio_pika.Message(body, message_id=event_id), TOPOLOGY.routing_keys[0], mandatory=True
        )
    await take_from_work_queue(deployed, event_id)


async def take_from_work_queue(deployed: Deployed, event_id: str) -> None:
    """The event `event_id` is the next message of the work queue; take it (other tests read that queue)."""
    async with deployed.connect("worker") as connection:
        channel = await connection.channel()
        message = await get_one(await channel.get_queue(TOPOLOGY.work_queue, ensure=False))
        await message.ack()
    assert message.message_id == event_id


async def test_a_shard_can_no_longer_reach_another_shards_queues_or_keys(deployed: Deployed) -> None:
    """Review rows 2 and 3: `shard-5` binding its own queues with `shard.7`, and get, purge, delete, consume
    of shard 7's queues. Before: all allowed (a copy of shard 7's result and notice, a result read, a queue
    purged, a queue deleted). After: each one ACCESS_REFUSED, and shard 7's messages stay where they were."""
    await shard_queues_exist(deployed, OTHER_SHARD)
    await shard_queues_exist(deployed, SHARD_ID)
    victim = {kind: shard_queue_name(SHARD_ID, kind) for kind in ("results", "notifications")}
    for kind in victim:
        async with deployed.connect(SHARD) as connection:
            await (await (await connection.channel()).get_queue(victim[kind], ensure=False)).purge()
    await publish_to_shard(deployed, SHARD_ID, b'{"event_id": "for-shard-7"}')

    attempts = {
        "bind own results with shard.7": bind_queue(
            shard_queue_name(OTHER_SHARD, "results"), TOPOLOGY.results_exchange, f"shard.{SHARD_ID}"
        ),
        "bind own notifications with shard.7": bind_queue(
            shard_queue_name(OTHER_SHARD, "notifications"),
            TOPOLOGY.notifications_exchange,
            f"shard.{SHARD_ID}",
        ),
        "bind tool_calls to shard 7's results (exchange to exchange)": bind_exchange(
            TOPOLOGY.tool_calls_exchange, TOPOLOGY.results_exchange, f"shard.{SHARD_ID}"
        ),
        "get shard 7's result": get_from(victim["results"]),
        "consume shard 7's notices": consume(victim["notifications"]),
        "purge shard 7's results": purge(victim["results"]),
        "delete shard 7's notifications queue": delete(victim["notifications"]),
    }
    allowed = [what for what, action in attempts.items() if not await is_refused(deployed, OTHER, action)]
    assert allowed == []

    # nothing moved: shard 7 still has its result and notice, shard 5 got no copy
    await publish_to_shard(deployed, SHARD_ID, b'{"event_id": "for-shard-7-again"}')
    assert [await queue_depth(deployed, victim[kind]) for kind in victim] == [2, 2]
    other = [shard_queue_name(OTHER_SHARD, kind) for kind in ("results", "notifications")]
    assert [await queue_depth(deployed, name) for name in other] == [0, 0]
    for kind in victim:
        async with deployed.connect(SHARD) as connection:
            await (await (await connection.channel()).get_queue(victim[kind], ensure=False)).purge()


async def test_a_shard_cannot_squat_a_future_shards_queue(deployed: Deployed) -> None:
    """Review row 4. Before: `bot` pre-declared `tomori.shard.8.results` with `x-max-length: 0` and shard 8's
    own declare then failed with PRECONDITION_FAILED. After: the pre-declare is refused; shard 8 declares."""
    future = SHARD_ID + 1
    name = shard_queue_name(future, "results")
    squat = declare_queue(name, {"x-max-length": 0})
    assert await is_refused(deployed, OTHER, squat)
    async with deployed.connect(shard_user(future)) as connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(name, durable=True)
        await queue.bind(TOPOLOGY.results_exchange, routing_key=f"shard.{future}")
        await queue.delete(if_unused=False, if_empty=False)


async def test_known_limit_a_shard_may_still_publish_an_event_naming_another_shard(
    deployed: Deployed,
) -> None:
    """Review row 5, unchanged and documented (deploy/README.md): the broker checks the routing key, not the
    body, so `shard-5` may publish an event that says `shard_id: 7` and names any guild."""
    event_id = str(uuid.uuid4())
    body = json.dumps(event_body({}, persona_id=1, event_id=event_id, shard_id=SHARD_ID)).encode()
    async with deployed.connect(OTHER) as connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        tool_calls = await channel.get_exchange(TOPOLOGY.tool_calls_exchange, ensure=False)
        await tool_calls.publish(
            aio_pika.Message(body, message_id=event_id), TOPOLOGY.routing_keys[0], mandatory=True
        )
    await take_from_work_queue(deployed, event_id)


async def test_the_worker_may_bind_only_the_tool_calls_it_serves(deployed: Deployed) -> None:
    """Review row 9. Before: `worker` (and `operator`) could bind `ltm.create_memory` to `tomori.tool_calls`
    with `#`, pulling every tool's calls in. After: only the two keys of CONTRACT.md are allowed."""
    for user in ("worker", "operator"):
        for key in ("#", "tool.*", "tool.some_other_tool"):
            assert await is_refused(deployed, user, bind_work_queue(key)), (user, key)
        for key in TOPOLOGY.routing_keys:
            assert not await is_refused(deployed, user, bind_work_queue(key)), (user, key)


async def test_known_limit_the_worker_may_still_reach_any_queue_through_the_default_exchange(
    deployed: Deployed,
) -> None:
    """Review row 7, unchanged and documented (docs/known-limits.md): the worker parks retries through the
    default exchange, so it has write on `amq.default`, and RabbitMQ checks no queue name there (the write
    regex's queue names are not consulted: a user with write on `ltm.create_memory.retry.1000` but not on
    `amq.default` is refused even that queue). So `worker` can put a message into a shard's queue by name."""
    await shard_queues_exist(deployed, SHARD_ID)
    victim = shard_queue_name(SHARD_ID, "results")
    before = await queue_depth(deployed, victim)
    assert not await is_refused(deployed, "worker", publish("", victim))
    deadline = time.monotonic() + WAIT_SECONDS
    while await queue_depth(deployed, victim) == before:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    async with deployed.connect(SHARD) as connection:
        await (await (await connection.channel()).get_queue(victim, ensure=False)).purge()


#: the shared user of earlier definitions files (deploy/README.md "Migrating from the shared `bot` user")
OLD_BOT_PERMISSIONS = {
    "configure": r"^tomori\.shard\.[0-9]+\.(results|notifications)$",
    "write": r"^(tomori\.tool_calls|tomori\.shard\.[0-9]+\.(results|notifications))$",
    "read": r"^(tomori\.(tool_results|notifications)|tomori\.shard\.[0-9]+\.(results|notifications))$",
}
OLD_BOT_TOPICS = [
    {"exchange": TOPOLOGY.tool_calls_exchange, "write": r"^tool\.[A-Za-z0-9_]+$", "read": "^$"},
    {"exchange": TOPOLOGY.results_exchange, "write": "^$", "read": r"^shard\.[0-9]+$"},
    {"exchange": TOPOLOGY.notifications_exchange, "write": "^$", "read": r"^shard\.[0-9]+$"},
]


def with_user(url: str, user: str, password: str) -> str:
    """`url` (a Deployed URL) with other credentials."""
    parts = urlsplit(url)
    address = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{quote(user, safe='')}:{quote(password, safe='')}@{address}").geturl()


async def test_the_migration_from_the_shared_bot_user(test_services: Services) -> None:
    """deploy/README.md's steps on a broker where shards ran as `bot`: the shard users exist beside `bot`; a
    shard's queues (declared by `bot`, a result waiting) are taken over by its own user with nothing lost; the
    binding `bot` left on another shard's queue is visible and its user cannot remove it; then `bot` goes and
    the shard works on."""
    with imported(test_services, with_topology=True) as deployed:
        bot = f"bot-{secrets.token_hex(4)}"
        bot_password = "bot-dev-password"
        try:
            deployed.admin.import_definitions(
                {
                    "users": [
                        {
                            "name": bot,
                            "password_hash": shard_users.password_hash(bot_password),
                            "hashing_algorithm": "rabbit_password_hashing_sha256",
                            "tags": [],
                            "limits": {},
                        }
                    ],
                    "permissions": [{"user": bot, "vhost": deployed.vhost, **OLD_BOT_PERMISSIONS}],
                    "topic_permissions": [
                        {"user": bot, "vhost": deployed.vhost, **topic} for topic in OLD_BOT_TOPICS
                    ],
                }
            )
            bot_url = with_user(deployed.urls["worker"], bot, bot_password)
            deadline = time.monotonic() + WAIT_SECONDS
            while True:  # rabbitmqctl's import is asynchronous
                try:
                    bot_connection = await aio_pika.connect(bot_url, timeout=10)
                    break
                except Exception:
                    assert time.monotonic() < deadline, "the bot user was not imported"
                    await asyncio.sleep(0.2)

            # before: shard 7 and shard 5 run as `bot`; `bot` also bound shard 5's queue with shard 7's key
            try:
                channel = await bot_connection.channel()
                for shard_id in (SHARD_ID, OTHER_SHARD):
                    for kind, exchange in (
                        ("results", TOPOLOGY.results_exchange),
                        ("notifications", TOPOLOGY.notifications_exchange),
                    ):
                        queue = await channel.declare_queue(shard_queue_name(shard_id, kind), durable=True)
                        await queue.bind(exchange, routing_key=f"shard.{shard_id}")
                rogue = await channel.get_queue(shard_queue_name(OTHER_SHARD, "results"), ensure=False)
                await rogue.bind(TOPOLOGY.results_exchange, routing_key=f"shard.{SHARD_ID}")
            finally:
                await bot_connection.close()
            await publish_to_shard(deployed, SHARD_ID, b'{"event_id": "waiting"}')

            # step 3: shard 7 restarts as shard-7; its queue and the waiting result are there
            async with HarnessShard(deployed.urls[SHARD], SHARD_ID, declare_exchanges=False) as shard:
                await shard.wait_for_results(["waiting"], timeout=WAIT_SECONDS)
                # step 4: the binding `bot` left is listed, and shard 5's own user cannot remove it
                leftover = (
                    TOPOLOGY.results_exchange,
                    shard_queue_name(OTHER_SHARD, "results"),
                    f"shard.{SHARD_ID}",
                )
                assert leftover in deployed.admin.bindings(deployed.vhost)
                rebind = bind_queue(leftover[1], leftover[0], leftover[2])

                async def remove(channel: AbstractChannel) -> object:
                    return await (await channel.get_queue(leftover[1], ensure=False)).unbind(
                        leftover[0], routing_key=leftover[2]
                    )

                assert await is_refused(deployed, OTHER, remove)
                assert await is_refused(deployed, OTHER, rebind)

                # step 5: bot deleted; shard 7 keeps receiving as its own user
                deployed.admin.delete_user(bot)
                await publish_to_shard(deployed, SHARD_ID, b'{"event_id": "after"}')
                await shard.wait_for_results(["after"], timeout=WAIT_SECONDS)
            with pytest.raises(aiormq.exceptions.ProbableAuthenticationError):
                await aio_pika.connect(bot_url, timeout=10)
        finally:
            deployed.admin.delete_user(bot)


async def test_the_printed_rabbitmqctl_commands_make_a_working_confined_shard_user(
    test_services: Services,
) -> None:
    """`shard_users.py commands N` run by a shell as printed: shard N gets its result, and is refused another
    shard's key. Needs rabbitmqctl on the broker's machine (what the commands are for): this machine's, or a
    broker container's own shell (`docker exec`)."""
    with imported(test_services, with_topology=True) as deployed:
        shard_id = 1_000_000 + secrets.randbelow(9_000_000)  # a user name no one else on the broker has
        name, password = shard_users.user_name(shard_id), secrets.token_hex(12)
        script = "\n".join(shard_users.commands([shard_id], deployed.vhost))
        shell = ["bash", "-euo", "pipefail", "-c", script]
        container = test_services.resolve(RABBITMQ).container
        if container is not None:  # the password passes through the environment, not the command line
            shell = ["docker", "exec", "-e", f"SHARD_{shard_id}_PASSWORD", container, *shell]
        elif not isinstance(deployed.admin, RabbitmqctlAdmin):
            pytest.skip("the broker is administered through the management API here, not rabbitmqctl")
        try:
            done = await asyncio.to_thread(
                subprocess.run,
                shell,
                env=os.environ | {f"SHARD_{shard_id}_PASSWORD": password},
                capture_output=True,
                text=True,
                timeout=ADMIN_TIMEOUT * 6,
                check=False,
            )
            assert done.returncode == 0, done.stdout + done.stderr
            url = with_user(deployed.urls["worker"], name, password)
            async with HarnessShard(url, shard_id, declare_exchanges=False) as shard:
                await publish_to_shard(deployed, shard_id, b'{"event_id": "printed"}')
                await shard.wait_for_results(["printed"], timeout=WAIT_SECONDS)
            connection = await aio_pika.connect(url, timeout=10)
            try:
                channel = await connection.channel()
                queue = await channel.get_queue(shard_queue_name(shard_id, "results"), ensure=False)
                with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
                    await queue.bind(TOPOLOGY.results_exchange, routing_key=f"shard.{SHARD_ID}")
            finally:
                await connection.close()
        finally:
            deployed.admin.delete_user(name)
