"""The worker's consume loop in the test's own event loop (``Worker.run(signals=False)``) on the real
Postgres, RabbitMQ and Redis, each test on its own database and vhost: an event answered end to end, the
drain on a stop, the abandon on a lost connection, the consumer the broker cancels, the reconnect, and
every way a delivery ends settled exactly once. Assertions read what the broker, Postgres and Redis hold
(and the worker's log events); waits are on those, never on time alone.

Crashes (SIGKILL), signals, dependency outages, clusters and PgBouncer stay in tests/e2e, with the worker
as a process.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from datetime import datetime
from typing import Any
from urllib.parse import unquote, urlsplit

import aio_pika
import aio_pika.exceptions
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from contracts.models import DeadLetterKind, Status
from tests.factories import BotRows, event_body
from tests.services import is_this_machine
from tests.support.commands import run_command
from tests.support.harness import InvalidationListener, Shard, queue_depth, take_dead_letters
from tests.support.inprocess import Workers
from tests.support.wait import eventually
from worker.broker.dead_letters import describe_dead_letter
from worker.broker.topology import retry_queue_arguments
from worker.config import Topology
from worker.invalidation.redis import InvalidationPublisher
from worker.observability.tracing import TracedEvents
from worker.ops.dlq.kinds import replay_note
from worker.store.pool import create_pool

#: every wait's deadline: generous, for a loaded machine; a passing test never waits it out
WAIT = 60.0
WORK_QUEUE = "ltm.create_memory"
DLQ = "ltm.create_memory.dlq"
NOBODY = 77  # a shard with no queue bound to shard.77
#: the advisory lock the tests hold to keep events waiting at Postgres (see :func:`hold_at_postgres`)
LOCK = 4242
LOST = "rabbitmq connection lost; reconnecting"


# --- Postgres that keeps events waiting ---------------------------------------------------------------


async def hold_at_postgres(rows: BotRows) -> None:
    """From now on every memory insert waits for the advisory lock ``LOCK``, which ``rows``' connection
    holds until :func:`release`: the events stay in flight, at Postgres."""
    await rows.conn.execute(f"""
        CREATE FUNCTION held_insert() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN PERFORM pg_advisory_xact_lock({LOCK}); RETURN NEW; END $$;
        CREATE TRIGGER held_insert BEFORE INSERT ON server_memories
            FOR EACH ROW EXECUTE FUNCTION held_insert();
    """)
    await rows.conn.execute(f"SELECT pg_advisory_lock({LOCK})")


async def release(rows: BotRows) -> None:
    await rows.conn.execute(f"SELECT pg_advisory_unlock({LOCK})")


async def waiting_at_postgres(rows: BotRows) -> int:
    """How many of the worker's transactions wait for a lock (the test's, or the scope lock of an event
    ahead of them that waits for the test's)."""
    return int(
        await rows.conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
    )


async def publish_each_to_postgres(shard: Shard, rows: BotRows, bodies: list[dict[str, Any]]) -> None:
    """Publish ``bodies`` one at a time, each once the one before waits at Postgres: every event is then
    in flight in a batch of its own (the worker's pool has a connection for each)."""
    for n, body in enumerate(bodies, start=1):
        await shard.publish(body)
        await eventually(
            lambda n=n: _at_least(waiting_at_postgres(rows), n), f"{n} event(s) wait at Postgres"
        )


async def _at_least(count: Any, n: int) -> bool:
    return bool(await count >= n)


async def _is(count: Any, n: int) -> bool:
    return bool(await count == n)


async def memories(rows: BotRows) -> int:
    return int(await rows.conn.fetchval("SELECT count(*) FROM server_memories"))


async def ledger_has(rows: BotRows, event_id: str) -> bool:
    return bool(
        await rows.conn.fetchval(
            "SELECT count(*) FROM ltm_processed_events WHERE event_id = $1", uuid.UUID(event_id)
        )
    )


# --- the broker closing the worker's connection --------------------------------------------------------


async def rabbitmqctl(url: str) -> str:
    """The ``rabbitmqctl`` of the test's broker, to close the worker's connection the way a broker does;
    skips where there is none (a broker elsewhere, or in a container while a local one runs here)."""
    ctl = shutil.which("rabbitmqctl")
    if ctl is None or not is_this_machine(urlsplit(url).hostname or ""):
        pytest.skip("needs rabbitmqctl on the broker's machine to close a connection")
    code, text = await run_command(ctl, "list_vhosts", "name", "--quiet", "--no-table-headers", timeout=60)
    if code != 0 or unquote(urlsplit(url).path[1:]) not in text.splitlines():
        pytest.skip("this machine's rabbitmqctl manages another broker than the test's")
    return ctl


async def connections(ctl: str, url: str) -> list[str]:
    """The broker's connection ids on ``url``'s vhost."""
    vhost = unquote(urlsplit(url).path[1:])
    code, text = await run_command(
        ctl, "list_connections", "pid", "vhost", "--quiet", "--no-table-headers", timeout=60
    )
    assert code == 0, text
    return [row.split("\t")[0] for row in text.splitlines() if row.endswith(f"\t{vhost}")]


async def close_connection(ctl: str, connection: str) -> None:
    code, text = await run_command(ctl, "close_connection", connection, "closed by the test", timeout=60)
    assert code == 0, text


async def consumers(url: str, queue: str = WORK_QUEUE) -> int | None:
    """The consumers of ``queue``; None when it does not exist."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        try:
            declared = await channel.declare_queue(queue, passive=True)
        except aio_pika.exceptions.ChannelNotFoundEntity:
            return None
        return int(declared.declaration_result.consumer_count or 0)
    finally:
        await connection.close()


def event(persona_id: int, content: str, **kwargs: Any) -> dict[str, Any]:
    return event_body(
        {"memory_content": content, "memory_scope": "server_wide"}, persona_id=persona_id, **kwargs
    )


# --- the tests ------------------------------------------------------------------------------------------


async def test_a_saved_event_is_answered_end_to_end(
    workers: Workers, rows: BotRows, rabbitmq_url: str
) -> None:
    world = await rows.world()
    worker = await workers.start()
    body = event(world.persona_id, "kept in process")
    async with InvalidationListener(workers.settings.redis_url) as listener, Shard(rabbitmq_url) as shard:
        await shard.publish(body)
        await shard.wait_for_results([body["event_id"]], timeout=WAIT)
        await eventually(lambda: listener.of(body["event_id"]), "the invalidation on Redis")
    [result] = shard.received.results[body["event_id"]]
    assert (result["success"], result["status"]) == (True, Status.SAVED)
    assert await rows.conn.fetchval("SELECT content FROM server_memories") == "kept in process"
    assert await ledger_has(rows, body["event_id"])
    assert await workers.stop(worker) == 0
    assert await queue_depth(rabbitmq_url, WORK_QUEUE) == 0
    assert workers.count("stopped cleanly") == 1


class RecordedPublisher(InvalidationPublisher):
    """The Redis publisher a test hands the worker: it records what it was asked to publish."""

    def __init__(self, url: str, channel: str) -> None:
        super().__init__(url, channel)
        self.published: list[dict[str, Any]] = []

    async def publish(self, invalidation: dict[str, Any]) -> None:
        self.published.append(invalidation)
        await super().publish(invalidation)


async def test_a_worker_given_a_pool_a_cache_and_a_tracer_uses_them_and_leaves_them_open(
    workers: Workers, rows: BotRows, rabbitmq_url: str, migrated_dsn: str
) -> None:
    """Worker(settings, pool=..., cache=..., tracer=...): the event is saved through the test's pool (a
    trigger records the application name of the connection that wrote it), its invalidation goes through
    the test's publisher and its span to the test's tracer (tracing is off in the settings); after the stop
    all three are still the test's to close."""
    world = await rows.world()
    await rows.conn.execute("""
        CREATE TABLE written_by (application text);
        CREATE FUNCTION record_writer() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN INSERT INTO written_by VALUES (current_setting('application_name')); RETURN NEW; END $$;
        CREATE TRIGGER record_writer AFTER INSERT ON server_memories
            FOR EACH ROW EXECUTE FUNCTION record_writer();
    """)
    given = "ltm-test-given-pool"
    joined = "&" if "?" in migrated_dsn else "?"
    pool = await create_pool(f"{migrated_dsn}{joined}application_name={given}", size=2)
    cache = RecordedPublisher(workers.settings.redis_url, workers.settings.topology.invalidation_channel)
    spans = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(spans))
    assert workers.settings.tracing == "off"
    try:
        worker = await workers.start(
            adapters={"pool": pool, "cache": cache, "tracer": TracedEvents(provider)}
        )
        body = event(world.persona_id, "through the given pool")
        async with Shard(rabbitmq_url) as shard:
            await shard.publish(body)
            await shard.wait_for_results([body["event_id"]], timeout=WAIT)
        [result] = shard.received.results[body["event_id"]]
        assert (result["success"], result["status"]) == (True, Status.SAVED)
        await eventually(lambda: cache.published, "the invalidation through the given publisher")
        assert await rows.conn.fetchval("SELECT array_agg(application) FROM written_by") == [given]
        [span] = [s for s in spans.get_finished_spans() if s.name == "ltm.create_memory process"]
        assert span.attributes is not None
        assert span.attributes["messaging.message.id"] == body["event_id"]
        assert await workers.stop(worker) == 0
        # the worker closed none of them: the test still uses each
        assert not pool.is_closing()
        assert await pool.fetchval("SELECT content FROM server_memories") == "through the given pool"
        assert await cache.ping()
    finally:
        await pool.close()
        await cache.close()
        provider.shutdown()


async def test_a_stop_finishes_the_events_in_flight_and_takes_no_more(
    workers: Workers, rows: BotRows, rabbitmq_url: str
) -> None:
    """The drain: on a stop the consumer is cancelled at once, the events in flight (here waiting at
    Postgres) finish, are answered and acked; an event published after the stop stays in the queue. (The
    work queue is a quorum queue: its consumer count still includes a cancelled consumer while it holds
    unacked deliveries, so the cancel shows only in what is delivered.)"""
    world = await rows.world()
    await hold_at_postgres(rows)
    worker = await workers.start(postgres_pool_size=6)
    bodies = [event(world.persona_id, f"in flight {n}") for n in range(3)]
    late = event(world.persona_id, "after the stop")
    async with Shard(rabbitmq_url) as shard:
        await publish_each_to_postgres(shard, rows, bodies)
        worker.stop()
        # taken by no one: the consumer is cancelled (a delivery that raced the cancel is handed back)
        await shard.publish(late)
        await eventually(
            lambda: _is(queue_depth(rabbitmq_url, WORK_QUEUE), 1), "the late event waits in the queue"
        )
        [(_, task)] = workers.running
        assert not task.done()  # still draining: the events wait at Postgres
        await release(rows)
        assert await asyncio.wait_for(task, WAIT) == 0
        workers.running.clear()
        await shard.wait_for_results([b["event_id"] for b in bodies], timeout=WAIT)
        await shard.settle(timeout=WAIT)
    for body in bodies:
        [result] = shard.received.results[body["event_id"]]
        assert result["success"] is True
    assert late["event_id"] not in shard.received.results
    assert await memories(rows) == 3
    # the drained events were acked; only the late one is left, ready for the next worker
    assert await queue_depth(rabbitmq_url, WORK_QUEUE) == 1
    assert workers.count("stopped cleanly") == 1
    assert workers.count("grace period over: in-flight events are requeued") == 0


async def test_a_lost_connection_abandons_the_events_in_flight_to_the_broker(
    workers: Workers, rows: BotRows, rabbitmq_url: str
) -> None:
    """The broker closes the worker's connection while events wait at Postgres: the worker cancels them
    (nothing published, nothing acked), the broker requeues them, the worker reconnects, takes them again
    and answers each once; no delivery is settled twice (that would close the channel: another loss)."""
    ctl = await rabbitmqctl(rabbitmq_url)
    world = await rows.world()
    await hold_at_postgres(rows)
    await workers.start(postgres_pool_size=6)
    [connection] = await connections(ctl, rabbitmq_url)
    bodies = [event(world.persona_id, f"abandoned {n}") for n in range(3)]
    async with Shard(rabbitmq_url) as shard:
        await publish_each_to_postgres(shard, rows, bodies)
        await close_connection(ctl, connection)
        await workers.wait_for_log(LOST)
        # the cancelled transactions let go of Postgres; the broker has the deliveries back
        await workers.wait_for_log("consuming", at_least=2)
        await eventually(lambda: _at_least(waiting_at_postgres(rows), 1), "the redelivered events wait again")
        assert shard.received.results == {}  # the abandoned events published nothing
        await release(rows)
        await shard.wait_for_results([b["event_id"] for b in bodies], timeout=WAIT)
        [(worker, _)] = workers.running
        assert await workers.stop(worker) == 0
        await shard.settle(timeout=WAIT)
    for body in bodies:
        [result] = shard.received.results[body["event_id"]]
        assert result["success"] is True
    assert await memories(rows) == 3
    assert await queue_depth(rabbitmq_url, WORK_QUEUE) == 0
    # one loss, the test's: a delivery settled twice would have closed the channel, another loss
    assert workers.count(LOST) == 1
    assert workers.count("consuming") == 2


async def test_a_connection_the_broker_drops_is_made_again(
    workers: Workers, rows: BotRows, rabbitmq_url: str
) -> None:
    ctl = await rabbitmqctl(rabbitmq_url)
    world = await rows.world()
    worker = await workers.start()
    [first] = await connections(ctl, rabbitmq_url)
    await close_connection(ctl, first)
    await workers.wait_for_log(LOST)
    await workers.wait_for_log("consuming", at_least=2)
    [second] = await connections(ctl, rabbitmq_url)
    assert second != first
    body = event(world.persona_id, "after the reconnect")
    async with Shard(rabbitmq_url) as shard:
        await shard.publish(body)
        await shard.wait_for_results([body["event_id"]], timeout=WAIT)
    assert shard.received.results[body["event_id"]][0]["success"] is True
    assert await workers.stop(worker) == 0


async def test_a_deleted_work_queue_is_declared_again_and_consumed(
    workers: Workers, rows: BotRows, rabbitmq_url: str
) -> None:
    """The broker cancels the consumer (its queue was deleted): aio-pika does not restore it, the worker
    starts over on a new connection: declares the topology again and consumes."""
    world = await rows.world()
    worker = await workers.start()
    connection = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await connection.channel()
        await channel.queue_delete(WORK_QUEUE)
    finally:
        await connection.close()
    await workers.wait_for_log("rabbitmq cancelled the consumer; reconnecting")
    await workers.wait_for_log("consuming", at_least=2)
    assert await consumers(rabbitmq_url) == 1
    body = event(world.persona_id, "after the queue came back")
    async with Shard(rabbitmq_url) as shard:
        await shard.publish(body)
        await shard.wait_for_results([body["event_id"]], timeout=WAIT)
    assert shard.received.results[body["event_id"]][0]["success"] is True
    assert await workers.stop(worker) == 0


# --- every delivery settled once (from tests/e2e/test_settlement.py) --------------------------------------


async def test_unreadable_event_for_an_unbound_shard_is_dead_lettered_once(
    workers: Workers, rabbitmq_url: str
) -> None:
    """A schema dead letter whose ids are readable, for a shard nobody listens for: the DLQ copy is
    confirmed, the failure result comes back unroutable, and the delivery is acked anyway; later lives of
    the worker find nothing to copy again."""
    worker = await workers.start()
    body = {"schema_version": 1, "event_id": str(uuid.uuid4()), "tool_call_id": "c", "shard_id": NOBODY}
    async with Shard(rabbitmq_url) as shard:
        await shard.publish(json.dumps(body).encode())
        await workers.wait_for_log("dead-lettered unreadable event")
    await workers.wait_for_log("failure result not delivered; the dead letter keeps the event")
    assert await workers.stop(worker) == 0

    [line] = workers.lines("failure result not delivered; the dead letter keeps the event")
    assert line["event_id"] == body["event_id"]
    assert line["shard_id"] == NOBODY
    assert f"shard {NOBODY} has no queue bound for its results" in line["error"]
    assert await queue_depth(rabbitmq_url, WORK_QUEUE) == 0
    assert await queue_depth(rabbitmq_url, DLQ) == 1

    assert await workers.restart_twice(rabbitmq_url) == (0, 1)
    [letter] = await take_dead_letters(rabbitmq_url, 1)
    assert letter.headers["x-ltm-error-kind"] == DeadLetterKind.SCHEMA
    assert json.loads(letter.body) == body


async def test_internal_failure_for_an_unbound_shard_is_dead_lettered_once(
    workers: Workers, rows: BotRows, rabbitmq_url: str
) -> None:
    """A valid event that hits a bug, for a shard nobody listens for: its failure result cannot be routed
    either, and the delivery is still acked once its DLQ copy is confirmed."""
    world = await rows.world()
    await rows.conn.execute("""
        CREATE FUNCTION forced_failure() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'forced failure'; END $$;
        CREATE TRIGGER forced_failure BEFORE INSERT ON server_memories
            FOR EACH ROW EXECUTE FUNCTION forced_failure();
    """)
    worker = await workers.start()
    body = event(world.persona_id, "boom", shard_id=NOBODY)
    async with Shard(rabbitmq_url) as shard:
        await shard.publish(body)
        await workers.wait_for_log("failure result not delivered; the dead letter keeps the event")
    assert await workers.stop(worker) == 0

    assert await queue_depth(rabbitmq_url, WORK_QUEUE) == 0
    assert await workers.restart_twice(rabbitmq_url) == (0, 1)
    [letter] = await take_dead_letters(rabbitmq_url, 1)
    assert letter.headers["x-ltm-error-kind"] == DeadLetterKind.INTERNAL
    assert letter.message_id == body["event_id"]


async def test_a_refused_retry_copy_hands_the_delivery_back(
    workers: Workers, rows: BotRows, rabbitmq_url: str
) -> None:
    """The broker refuses the retry copy (its retry queue was deleted under the worker): the delivery is
    handed back to the work queue instead of being held unacked, comes back, and once the retry queue
    exists again ends where a transient fault should (here: the DLQ, since its shard is never bound)."""
    world = await rows.world()
    worker = await workers.start(retry_max_attempts=2, retry_base_delay_ms=100)
    retry_queue = "ltm.create_memory.retry.100"
    connection = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await connection.channel()
        await channel.queue_delete(retry_queue)
        body = event(world.persona_id, "handed back", shard_id=NOBODY)
        async with Shard(rabbitmq_url) as shard:
            await shard.publish(body)
            # the result is unroutable (transient), the retry copy is refused: handed back, and again
            await workers.wait_for_log("delivery not settled; handing it back to the queue", at_least=2)
            assert workers.count("could not route a failed event; it will be redelivered") >= 2
            await channel.declare_queue(
                retry_queue, durable=True, arguments=retry_queue_arguments(Topology())
            )
            [letter] = await take_dead_letters(rabbitmq_url, 1, timeout=WAIT)
    finally:
        await connection.close()
    assert await workers.stop(worker) == 0

    assert letter.headers["x-ltm-error-kind"] == DeadLetterKind.TRANSIENT_EXHAUSTED
    assert letter.message_id == body["event_id"]
    assert await queue_depth(rabbitmq_url, WORK_QUEUE) == 0
    # handed back, redelivered and answered from the ledger: the memory was saved once
    assert await memories(rows) == 1


async def test_a_result_with_no_route_says_the_shard_has_no_queue_for_it(
    workers: Workers, rows: BotRows, rabbitmq_url: str
) -> None:
    """Newcomer review 5, N2: a shard that publishes before it declares its results queue gets its event
    processed, then the result comes back NO_ROUTE on every attempt. The dead letter names the cause (the
    shard's results queue) and `dlq show` says what to do about it, not about a database fault."""
    world = await rows.world()
    worker = await workers.start(retry_max_attempts=2, retry_base_delay_ms=100)
    body = event(world.persona_id, "no route", shard_id=NOBODY)
    async with Shard(rabbitmq_url) as shard:
        await shard.publish(body)
        [letter] = await take_dead_letters(rabbitmq_url, 1, timeout=WAIT)
    assert await workers.stop(worker) == 0
    headers = dict(letter.headers or {})
    assert headers["x-ltm-error-kind"] == DeadLetterKind.TRANSIENT_EXHAUSTED
    error = str(headers["x-ltm-error"])
    assert f"shard {NOBODY} has no queue bound for its results, tomori.shard.{NOBODY}.results" in error
    assert "x-ltm-first-error" not in headers, "every attempt failed alike: the error says it"
    described = describe_dead_letter(
        letter.body, headers, message_id=letter.message_id, routing_key="", topology=Topology()
    )
    assert replay_note(described.kind, described.errors).startswith("the shard has no queue bound")


# --- every failure ends somewhere a person can see (from tests/e2e/test_failures.py) ----------------------

KIND, ERROR, ATTEMPTS, FAILED_AT = "x-ltm-error-kind", "x-ltm-error", "x-ltm-attempts", "x-ltm-failed-at"


def assert_headers(headers: dict[str, Any], kind: str, attempts: int, error_contains: str) -> None:
    assert headers[KIND] == kind
    assert headers[ATTEMPTS] == attempts
    assert error_contains in headers[ERROR]
    assert "\n" not in headers[ERROR]
    assert datetime.fromisoformat(headers[FAILED_AT].replace("Z", "+00:00")).tzinfo is not None


async def test_unreadable_bodies_are_dead_lettered_at_once(
    workers: Workers, rows: BotRows, rabbitmq_url: str
) -> None:
    world = await rows.world()
    worker = await workers.start()
    unknown_version = event(world.persona_id, "x")
    unknown_version["schema_version"] = 2
    missing_id = event_body({}, persona_id=world.persona_id)
    del missing_id["event_id"]
    huge = event(world.persona_id, "x" * 300 * 1024)
    cases = {
        "not-json": (b"\xff\xfe not json at all", DeadLetterKind.MALFORMED, "not UTF-8 JSON"),
        "array": (b"[1, 2, 3]", DeadLetterKind.MALFORMED, "is not an object"),
        "missing-id": (json.dumps(missing_id).encode(), DeadLetterKind.SCHEMA, "event_id"),
        "version": (json.dumps(unknown_version).encode(), DeadLetterKind.SCHEMA, "schema_version"),
        "huge": (json.dumps(huge).encode(), DeadLetterKind.SCHEMA, "byte limit"),
    }
    async with Shard(rabbitmq_url) as shard:
        for name, (body, _, _) in cases.items():
            await shard.publish(
                body, headers={"test-case": name, "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}
            )
        letters = await take_dead_letters(rabbitmq_url, len(cases), timeout=WAIT)
        # only the unknown schema_version still has readable ids: its shard is answered
        await shard.wait_for_results([unknown_version["event_id"]], timeout=WAIT)
        assert await workers.stop(worker) == 0  # the worker went on to the end
        await shard.settle(timeout=WAIT)
    assert await queue_depth(rabbitmq_url, WORK_QUEUE) == 0  # every delivery acked

    by_case = {letter.headers["test-case"]: letter for letter in letters}
    assert set(by_case) == set(cases)
    for name, (body, kind, error) in cases.items():
        letter = by_case[name]
        assert_headers(letter.headers, kind, 1, error)
        assert letter.body == body  # body unchanged
        assert letter.routing_key == "tool.create_long_term_memory"
        assert letter.type is None or letter.type == "tool_call.v1"
    [result] = shard.received.results[unknown_version["event_id"]]
    assert result["status"] == Status.INTERNAL_ERROR
    assert result["success"] is False
    assert set(shard.received.results) == {unknown_version["event_id"]}


async def test_a_step_that_raises_is_an_internal_dead_letter_and_the_worker_goes_on(
    workers: Workers, rows: BotRows, rabbitmq_url: str
) -> None:
    world = await rows.world()
    # a real failure inside the transaction that the worker does not expect (SQLSTATE P0001)
    await rows.conn.execute("""
        CREATE FUNCTION forced_failure() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'forced failure for %', NEW.content; END $$;
        CREATE TRIGGER forced_failure BEFORE INSERT ON server_memories
            FOR EACH ROW WHEN (NEW.content = 'boom') EXECUTE FUNCTION forced_failure();
    """)
    worker = await workers.start()
    bad = event(world.persona_id, "boom")
    good = event(world.persona_id, "fine")
    async with Shard(rabbitmq_url) as shard:
        await shard.publish(bad)
        await shard.publish(good)
        await shard.wait_for_results([bad["event_id"], good["event_id"]], timeout=WAIT)
        [letter] = await take_dead_letters(rabbitmq_url, 1, timeout=WAIT)
    assert await workers.stop(worker) == 0

    assert_headers(letter.headers, DeadLetterKind.INTERNAL, 1, "RaiseError: forced failure for boom")
    assert letter.message_id == bad["event_id"]
    [failure] = shard.received.results[bad["event_id"]]
    assert failure["status"] == Status.INTERNAL_ERROR
    assert failure["error"] == "Internal bot error: the memory could not be processed"
    assert shard.received.results[good["event_id"]][0]["success"] is True
    # the failed event wrote nothing: no memory, no outcome, so a replay processes it for real
    assert not await ledger_has(rows, bad["event_id"])
    assert await memories(rows) == 1
    # logged with its traceback (rendered as text by the log configuration: tests/unit/test_logs.py)
    [internal] = workers.lines("internal error; dead-lettered")
    assert internal.get("exc_info")
