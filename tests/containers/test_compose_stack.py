"""deploy/compose.yaml for real: build, `up --build --wait`, a shard's round trip, a SIGTERM, `down -v`.

One test, one stack (project `ltmtest<hex>`, free loopback ports, the images of the LTM_*_IMAGE variables
when set). It checks, in order:

1. `docker compose up --build --wait` brings every service up: the worker containers healthy (Docker's own
   healthcheck state), running as uid 10001 on a read-only root file system, `migrate` exited 0.
2. As `shard-0` (deploy/rabbitmq/definitions.json has a user per shard), with `user_id` set to it (the stack's
   workers require it), a server-wide and a personal save get both results and both notices on the shard's
   queues, and both invalidations on the stack's Redis, read as its `shard` user (deploy/redis/users.acl),
   which may not publish one or read a key; a client without credentials gets nothing. The bot tables are
   seeded first through the stack's published Postgres port.
3. With a batch of events held in flight in both workers (a trigger holds every save at a gate inside
   Postgres), `docker kill -s TERM` of one worker: it finishes what it holds and exits 0, the other answers
   the rest; every event is answered exactly once and the memories table holds one row per event.
4. `docker compose down -v` leaves no container, volume or network of the project.

The time of each step, the image's size and the base image are printed (`pytest -s`); nothing asserts on
time. On failure the error carries `docker compose logs`. The stack always goes down, and the worker image
(tagged for this run) is removed.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis
import redis.exceptions

from contracts.models import Status
from tests.containers.compose import ComposeStack, container_logs, inspect, json_lines, run
from tests.containers.conftest import REQUIRE_DOCKER_ENV_VAR
from tests.factories import GUILD, BotRows, event_body, member
from tests.support.harness import InvalidationListener, Shard, invalidation_key
from tests.support.outages import Gate
from tests.support.wait import eventually
from worker.testing.images import PYTHON

SHARD = 0
#: the stack's workers require each event's AMQP user_id to be its shard's user (LTM_SHARD_IDENTITY=required)
SHARD_USER = "shard-0"
SPARROW = "1150000000000000201"
BATCH = 200
#: two servers with two personas each: four scopes of 50 events, under compose's MAX_SERVER_MEMORIES (100)
BATCH_GUILDS = ("1150000000000000002", "1150000000000000003")
NON_ROOT_UID = "10001"
STOPPING = "stopping: no new events; finishing the ones in flight"
#: generous: a loaded two-core machine, containers sharing it
DEADLINE = 240.0


@pytest.fixture(scope="module")
def compose_cli(docker_engine: None) -> None:
    """`docker compose` (v2, with `up --wait`) must be there too."""
    try:
        run(["docker", "compose", "version"])
    except AssertionError as error:
        if os.environ.get(REQUIRE_DOCKER_ENV_VAR, "").strip() in {"1", "true", "yes"}:
            pytest.fail(f"docker compose is missing: {error}", pytrace=False)
        pytest.skip(f"docker compose is missing: {error}")


async def blocking(function: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.to_thread(function, *args)


async def wait_until(what: str, condition: Callable[[], Any], timeout: float = DEADLINE) -> Any:
    """``eventually`` (tests/support/wait.py) with a blocking condition (a docker command) run in a thread,
    so the shard's and the Redis listener's callbacks go on meanwhile; an async one is awaited."""
    return await eventually(condition, what, timeout, interval=0.2, in_thread=True)


async def test_the_compose_stack_builds_starts_answers_a_shard_survives_sigterm_and_goes(
    compose_cli: None,
) -> None:
    stack = ComposeStack()
    started = time.monotonic()
    print(f"\ncompose project {stack.project}, ports {stack.ports}, worker image {stack.worker_image}")
    try:
        try:
            await checks(stack)
        except Exception as error:
            error.add_note(f"--- docker compose logs (project {stack.project})\n{stack.logs()}")
            raise
        begin = time.monotonic()
        await blocking(stack.down)
        stack.timings["down -v"] = time.monotonic() - begin
        assert await blocking(stack.leftovers) == {"containers": [], "volumes": [], "networks": []}
    finally:
        await blocking(stack.down)
        await blocking(stack.remove_image)
        stack.timings["whole test"] = time.monotonic() - started
        print("compose stack timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in stack.timings.items()))


async def checks(stack: ComposeStack) -> None:
    await blocking(lambda: stack.timed("build", "build", timeout=900))
    size = int(run(["docker", "image", "inspect", "--format", "{{.Size}}", stack.worker_image]))
    print(f"worker image {stack.worker_image}: {size} bytes ({size / 1e6:.0f} MB) on {PYTHON.resolve()}")
    up = ("up", "--build", "--wait", "--wait-timeout", "600")
    await blocking(lambda: stack.timed("up --build --wait", *up, timeout=900))

    workers = await blocking(stack.containers, "worker")
    assert len(workers) == 2, workers
    await blocking(check_hardened, workers)
    [migrate] = await blocking(stack.containers, "migrate")
    state = (await blocking(inspect, migrate))["State"]
    assert (state["Status"], state["ExitCode"]) == ("exited", 0)

    conn = await asyncpg.connect(stack.postgres_dsn, timeout=30)
    try:
        begin = time.monotonic()
        await round_trip(stack, BotRows(conn))
        stack.timings["round trip"] = time.monotonic() - begin
        begin = time.monotonic()
        await sigterm_with_events_in_flight(stack, conn, workers)
        stack.timings[f"SIGTERM batch of {BATCH}"] = time.monotonic() - begin
    finally:
        await conn.close()


def check_hardened(workers: list[str]) -> None:
    """Healthy by Docker's own healthcheck, uid 10001, read-only root file system (a write is refused)."""
    for container in workers:
        found = inspect(container)
        assert found["State"]["Health"]["Status"] == "healthy", found["State"]
        assert found["HostConfig"]["ReadonlyRootfs"] is True
        assert run(["docker", "exec", container, "id", "-u"]).strip() == NON_ROOT_UID
        write = ["docker", "exec", container, "sh", "-c", "touch /opt/venv/x 2>&1 || true"]
        assert "Read-only file system" in run(write)
        # the tmpfs is the one writable place
        run(["docker", "exec", container, "sh", "-c", "touch /tmp/x && rm /tmp/x"])


async def round_trip(stack: ComposeStack, rows: BotRows) -> None:
    world = await rows.world()
    await rows.user(SPARROW)
    server_event = event_body(
        {"memory_content": "{user} likes dogs", "memory_scope": "server_wide"},
        persona_id=world.persona_id,
        shard_id=SHARD,
    )
    personal_event = event_body(
        {"memory_content": "{user} likes cats", "memory_scope": "target_user", "target_user": "Sparrow"},
        persona_id=world.persona_id,
        members=[member(SPARROW, "sparrow_ow", "Sparrow")],
        tool_name="remember_this_fact",
        shard_id=SHARD,
    )
    event_ids = [server_event["event_id"], personal_event["event_id"]]
    # the shard's own user may not declare exchanges: they come from the definitions file
    async with (
        Shard(stack.shard_0_url, SHARD, declare_exchanges=False, user_id=SHARD_USER) as shard,
        InvalidationListener(stack.redis_url) as redis,
    ):
        await shard.publish(server_event)
        await shard.publish(personal_event, routing_key="tool.remember_this_fact")
        await shard.wait_for_results(event_ids, timeout=DEADLINE)
        await wait_until("both notices", lambda: all(shard.received.notices.get(e) for e in event_ids))
        await wait_until("both invalidations", lambda: all(redis.of(e) for e in event_ids))

    for event_id in event_ids:
        [result] = shard.received.results[event_id]
        outcome = (result["success"], result["status"], result["replayed"])
        assert outcome == (True, Status.SAVED, False), result
    [server_notice] = shard.received.notices[event_ids[0]]
    [personal_notice] = shard.received.notices[event_ids[1]]
    assert server_notice["notice"]["kind"] == "server_memory"
    assert personal_notice["notice"]["kind"] == "personal_memory"
    assert shard.received.results[event_ids[1]][0]["data"]["target_user"] == "Sparrow (@sparrow_ow)"
    assert redis.of(event_ids[0]) == [
        {
            "schema_version": 1,
            "invalidation_id": invalidation_key(event_ids[0]),
            "kind": "tomori_state",
            "server_disc_id": GUILD,
        }
    ]
    assert redis.of(event_ids[1]) == [
        {
            "schema_version": 1,
            "invalidation_id": invalidation_key(event_ids[1]),
            "kind": "user",
            "user_disc_id": SPARROW,
        }
    ]
    server_id = shard.received.results[event_ids[0]][0]["data"]["memory_id"]
    assert await rows.conn.fetchval(
        "SELECT content FROM server_memories WHERE server_memory_id = $1", server_id
    ) == ("{user} likes dogs")
    await assert_redis_users_confined(stack)


async def assert_redis_users_confined(stack: ComposeStack) -> None:
    """deploy/redis/users.acl in the running stack (security review 4, N10): the shards' user may not publish
    a (forged) invalidation or read a key, and a client without credentials is refused everything."""
    shard = aioredis.Redis.from_url(stack.redis_url)
    try:
        assert await shard.ping()
        with pytest.raises(redis.exceptions.NoPermissionError):
            await shard.publish("tomori:cache-invalidation", b'{"kind": "tomori_state"}')
        with pytest.raises(redis.exceptions.NoPermissionError):
            await shard.get("any-key")
    finally:
        await shard.aclose()
    anonymous = aioredis.Redis.from_url(stack.redis_url.replace("shard:shard-dev-password@", ""))
    try:
        with pytest.raises(redis.exceptions.AuthenticationError):
            await anonymous.ping()
    finally:
        await anonymous.aclose()


async def batch_events(rows: BotRows, tag: str) -> list[dict[str, Any]]:
    """BATCH server-wide saves over four scopes (two servers, two personas each), for shard 0."""
    personas = []
    for guild in BATCH_GUILDS:
        server_id = await rows.server(guild)
        for nickname, is_alter in (("Tomori", False), ("Mika", True)):
            persona_id, _ = await rows.persona(server_id, nickname, is_alter=is_alter)
            personas.append((guild, persona_id))
    bodies = []
    for i in range(BATCH):
        guild, persona_id = personas[i % len(personas)]
        bodies.append(
            event_body(
                {"memory_content": f"{tag} fact {i}", "memory_scope": "server_wide"},
                persona_id=persona_id,
                guild=guild,
                shard_id=SHARD,
            )
        )
    return bodies


def worker_addresses(workers: list[str]) -> dict[str, str]:
    """The address of each worker container on the project's network: container id by address."""
    found = {}
    for container in workers:
        for network in inspect(container)["NetworkSettings"]["Networks"].values():
            found[network["IPAddress"]] = container
    return found


async def waiting_by_address(conn: asyncpg.Connection) -> dict[str, int]:
    """Transactions waiting on an advisory lock (the gate, or a scope lock behind it), by client address."""
    rows = await conn.fetch(
        "SELECT host(a.client_addr) AS address, count(*) AS waiting"
        " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE l.locktype = 'advisory' AND NOT l.granted AND a.datname = current_database()"
        " GROUP BY 1"
    )
    return {row["address"]: row["waiting"] for row in rows}


async def sigterm_with_events_in_flight(
    stack: ComposeStack, conn: asyncpg.Connection, workers: list[str]
) -> None:
    rows = BotRows(conn)
    tag = f"batch-{stack.project}"
    bodies = await batch_events(rows, tag)
    event_ids = [body["event_id"] for body in bodies]
    addresses = await blocking(worker_addresses, workers)
    gate = Gate(conn, "server_memories")
    await gate.close()
    victim = workers[0]
    opened = False
    try:
        async with Shard(stack.shard_0_url, SHARD, declare_exchanges=False, user_id=SHARD_USER) as shard:
            await shard.publish_many(bodies)

            async def both_workers_hold_events() -> bool:
                waiting = await waiting_by_address(conn)
                return all(waiting.get(address, 0) > 0 for address in addresses)

            await wait_until("a save of each worker waiting at the gate", both_workers_hold_events)
            run(["docker", "kill", "--signal", "TERM", victim])
            stopping = await wait_until(
                "the SIGTERMed worker logging that it stops",
                lambda: [
                    line for line in json_lines(container_logs(victim)) if line.get("event") == STOPPING
                ],
            )
            await gate.open()
            opened = True
            state = await wait_until(
                "the SIGTERMed worker exiting",
                lambda: (found := inspect(victim)["State"])["Status"] == "exited" and found,
                timeout=120,
            )
            assert state["ExitCode"] == 0, state
            await shard.wait_for_results(event_ids, timeout=DEADLINE)
            # nothing left in the work queue, ready or unacknowledged; then every answer has arrived
            await wait_until("an empty work queue", lambda: work_queue_messages(stack) == 0)
            await shard.settle(timeout=60)
            # a container stopped with its own stop signal stays stopped (restart: unless-stopped)
            after = await blocking(inspect, victim)
            assert (after["State"]["Status"], after["RestartCount"]) == ("exited", 0), after["State"]
    finally:
        if not opened:
            await gate.open()

    in_flight = stopping[0].get("in_flight")
    print(f"SIGTERM: the worker held {in_flight} events in flight; it exited 0")
    assert isinstance(in_flight, int), stopping
    assert in_flight > 0, stopping
    answered = {event_id: shard.received.results.get(event_id, []) for event_id in event_ids}
    twice = {event_id: results for event_id, results in answered.items() if len(results) != 1}
    assert not twice, f"{len(twice)} events answered other than once: {json.dumps(twice)[:2000]}"
    statuses = {(r[0]["success"], r[0]["status"], r[0]["replayed"]) for r in answered.values()}
    assert statuses == {(True, Status.SAVED, False)}
    saved = await conn.fetchval("SELECT count(*) FROM server_memories WHERE content LIKE $1", f"{tag} %")
    assert saved == BATCH
    # the other worker took over what the stopped one had not started
    processed_by = {
        container: sum(
            1
            for line in json_lines(container_logs(container))
            if line.get("event") == "event processed" and line.get("event_id") in answered
        )
        for container in workers
    }
    print(f"SIGTERM: events processed per worker {list(processed_by.values())}")
    assert sum(processed_by.values()) == BATCH


def work_queue_messages(stack: ComposeStack) -> int | None:
    """Messages in `ltm.create_memory`, ready and unacknowledged (rabbitmqctl in the broker's container)."""
    listed = stack.compose(
        "exec", "-T", "rabbitmq", "rabbitmqctl", "-q", "list_queues", "name", "messages", "--no-table-headers"
    )
    for line in listed.splitlines():
        parts = line.split()
        if parts and parts[0] == "ltm.create_memory":
            return int(parts[1])
    return None
