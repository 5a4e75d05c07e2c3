"""A kept letter's state follows what ``worker dlq`` does to its letter: a replay makes it ``replayed`` (and
``came_back`` once its copy is dead-lettered again), a purge ``purged``, the retention ``expired`` and then
gone. Real RabbitMQ (a fresh vhost with the worker's topology, the copies queue included) and Postgres (a
fresh migrated database); the letters are kept by the worker's own keeper (worker/runtime/keeper.py) running
in the test's event loop, and every ``worker dlq`` command runs as its own process.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aio_pika
import asyncpg
import orjson
import pytest

from tests.factories import event_body
from tests.integration import test_dlq as base
from tests.integration.test_dlq import (
    MAIN_KEY,
    TOPOLOGY,
    Broker,
    cli,
    cli_env,
    dead_letter_copy,
    event_ids,
    shard_message,
)
from tests.integration.test_dlq_oncall import history
from tests.support.harness import WorkerProcess, queue_depth
from tests.support.wait import eventually
from worker.broker.headers import Sender, rfc3339
from worker.broker.publisher import Publisher
from worker.broker.urls import vhost_of
from worker.config import Settings
from worker.ops.dlq.audit import Audit, Taken
from worker.ops.dlq.retention import RetentionSweeps
from worker.ops.dlq.running import begin
from worker.runtime.keeper import Keeper
from worker.store.pool import create_pool
from worker.testing.dead_letters import keep_copies

pytestmark = pytest.mark.integration

broker = base.broker
audit_database = base.audit_database

DLQ = TOPOLOGY.dead_letter_queue


@pytest.fixture
async def conn(audit_database: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(audit_database)
    try:
        yield connection
    finally:
        await connection.close()


@pytest.fixture
async def keeper(broker: Broker, audit_database: str) -> AsyncIterator[Keeper]:
    """The worker's keeper, draining the test vhost's copies queue into the test database."""
    pool = await create_pool(audit_database, size=2)
    connection = await aio_pika.connect(broker.url)
    keeper = Keeper(await connection.channel(), pool, TOPOLOGY)
    await keeper.start()
    try:
        yield keeper
    finally:
        await keeper.stop()
        await connection.close()
        await pool.close()


async def states(conn: asyncpg.Connection) -> dict[tuple[str, int], asyncpg.Record]:
    """The kept rows by (event id, replay count)."""
    rows = await conn.fetch("SELECT * FROM ltm_dead_letters")
    return {(row["event_id"], row["replay_count"]): row for row in rows}


async def kept(conn: asyncpg.Connection, count: int) -> dict[tuple[str, int], asyncpg.Record]:
    async def enough() -> dict[tuple[str, int], asyncpg.Record] | None:
        rows = await states(conn)
        return rows if len(rows) >= count else None

    found: dict[tuple[str, int], asyncpg.Record] = await eventually(enough, f"{count} letters kept")
    return found


async def dead_letters(broker: Broker, *, kind: str, ages: list[timedelta]) -> list[str]:
    """One worker dead letter per age (its x-ltm-failed-at that long ago); their event ids."""
    ids = []
    for age in ages:
        event_id = str(uuid.uuid4())
        ids.append(event_id)
        body = event_body({"memory_content": "x"}, persona_id=7, event_id=event_id)
        await dead_letter_copy(
            broker,
            shard_message(body, event_id=event_id),
            MAIN_KEY,
            kind=kind,
            error="database unavailable" if kind == "transient_exhausted" else "unknown schema_version 2",
            attempts=1,
            failed_at=datetime.now(UTC) - age,
        )
    return ids


async def test_a_replay_makes_its_letters_replayed_and_one_dead_lettered_again_came_back(
    broker: Broker, conn: asyncpg.Connection, keeper: Keeper, audit_database: str
) -> None:
    first, second = await dead_letters(broker, kind="transient_exhausted", ages=[timedelta(minutes=5)] * 2)
    rows = await kept(conn, 2)
    assert {row["state"] for row in rows.values()} == {"waiting"}

    ran = await cli("replay", "--rate", "0", "--by", "alice", url=broker.url)
    assert (ran.code, ran.out) == (0, "moved 2, kept 0\n"), ran.err
    [operation] = await history(audit_database)
    rows = await states(conn)
    for event_id in (first, second):
        row = rows[(event_id, 0)]
        assert row["state"] == "replayed"
        assert str(row["operation_id"]) == operation["operation_id"]
        assert row["state_detail"] == "replayed by alice as fast as the broker confirms"
    letters = await conn.fetch("SELECT letter_key FROM ltm_dlq_operation_letters ORDER BY position")
    assert {row["letter_key"] for row in letters} == {row["letter_key"] for row in rows.values()}

    # the worker fails one replayed copy again: it dead-letters it, and the keeper keeps it as a letter of its
    # own, its origin now came back
    publisher = Publisher.for_topology(broker.channel, broker.declared)
    copy = await broker.declared.work_queue.get(timeout=5)
    await publisher.dead_letter(copy, kind="internal", error="KeyError: 'x'", attempts=1, sender=Sender(None))
    await copy.ack()
    back = orjson.loads(copy.body)["event_id"]
    rows = await kept(conn, 3)
    assert rows[(back, 1)]["state"] == "waiting"
    assert rows[(back, 0)]["state"] == "came_back"
    other = first if back == second else second
    assert rows[(other, 0)]["state"] == "replayed"


async def test_a_purge_makes_its_letters_purged_and_leaves_the_others_waiting(
    broker: Broker, conn: asyncpg.Connection, keeper: Keeper
) -> None:
    [schema] = await dead_letters(broker, kind="schema", ages=[timedelta(minutes=1)])
    [transient] = await dead_letters(broker, kind="transient_exhausted", ages=[timedelta(minutes=1)])
    await kept(conn, 2)

    ran = await cli("purge", "--yes", "--kind", "schema", "--by", "bob", url=broker.url)
    assert (ran.code, ran.out) == (0, "deleted 1, kept 1\n"), ran.err
    rows = await states(conn)
    assert (rows[(schema, 0)]["state"], rows[(schema, 0)]["state_detail"]) == ("purged", "purged by bob")
    assert rows[(transient, 0)]["state"] == "waiting"
    assert rows[(transient, 0)]["operation_id"] is None
    assert await event_ids(broker.url) == [transient]


async def test_letters_taken_before_their_copies_are_kept_are_kept_in_the_state_the_operation_left(
    broker: Broker, conn: asyncpg.Connection, audit_database: str
) -> None:
    """The keepers behind (no worker ran, Postgres was down): a replay and a purge take letters whose copies
    wait. Kept later, each letter is kept as the operation left it (by its key in the operation's record),
    not as waiting: the table and the DLQ agree without a repair."""
    replayed, purged, left = await dead_letters(
        broker, kind="transient_exhausted", ages=[timedelta(minutes=5)] * 3
    )
    assert (
        await cli("replay", "--event-id", replayed, "--rate", "0", "--by", "alice", url=broker.url)
    ).code == 0
    assert (await cli("purge", "--yes", "--event-id", purged, "--by", "bob", url=broker.url)).code == 0
    assert await states(conn) == {}

    assert await keep_copies(broker.url, audit_database) == 3
    rows = await states(conn)
    assert rows[(replayed, 0)]["state"] == "replayed"
    assert rows[(replayed, 0)]["state_detail"] == "kept after replay by alice had taken it"
    assert rows[(purged, 0)]["state"] == "purged"
    assert rows[(purged, 0)]["state_detail"] == "kept after purge by bob had taken it"
    assert rows[(left, 0)]["state"] == "waiting"
    checked = await cli("check", url=broker.url)
    assert checked.code == 0, checked.out + checked.err


async def test_a_replay_settled_after_its_copy_came_back_makes_the_origin_came_back(
    conn: asyncpg.Connection, audit_database: str
) -> None:
    # the copy was dead-lettered again and kept between the broker's confirm and the replay's record of it
    event_id = str(uuid.uuid4())
    for count, key in ((0, "origin"), (1, "its-copy")):
        await conn.execute(
            "INSERT INTO ltm_dead_letters (letter_key, event_id, kind, error, routing_key, replay_count,"
            " body, body_size) VALUES ($1, $2, 'internal', 'x', $3, $4, ''::bytea, 0)",
            key,
            event_id,
            MAIN_KEY,
            count,
        )
    async with Audit.opened(audit_database) as audit:
        operation = await begin(audit, "replay", "carol", {}, vhost="/", queue=DLQ, rate=20.0)
        letter = Taken(1, event_id, "internal", 0, "origin")
        await operation.taking([letter])
        await operation.settled([letter], "replayed")
    rows = await states(conn)
    assert rows[(event_id, 0)]["state"] == "came_back"
    assert (
        rows[(event_id, 0)]["state_detail"]
        == "replayed by carol at 20/s; its replay had already failed again"
    )
    assert rows[(event_id, 1)]["state"] == "waiting"


# --- the retention ------------------------------------------------------------------------------------------


async def test_expire_removes_what_is_older_than_the_retention_from_queue_and_table_on_record(
    broker: Broker, conn: asyncpg.Connection, keeper: Keeper, audit_database: str
) -> None:
    old, old_replayed = await dead_letters(broker, kind="transient_exhausted", ages=[timedelta(days=5)] * 2)
    young, young_purged = await dead_letters(broker, kind="schema", ages=[timedelta(hours=1)] * 2)
    await kept(conn, 4)
    replayed = await cli("replay", "--rate", "0", "--event-id", old_replayed, url=broker.url)
    assert replayed.code == 0, replayed.err
    purged = await cli("purge", "--yes", "--event-id", young_purged, url=broker.url)
    assert purged.code == 0, purged.err

    ran = await cli("expire", "--retention", "2d", "--by", "ops", url=broker.url)
    assert ran.code == 0, ran.err
    said = (
        "expired 1 dead letter(s) older than 2d; removed 2 kept row(s) from public.ltm_dead_letters "
        "(expired 1, replayed 1)"
    )
    assert ran.out == f"{said}; kept 1 in {DLQ}\n"
    # gone from the queue and from the table; the younger ones untouched, whatever their state
    assert await event_ids(broker.url) == [young]
    rows = await states(conn)
    assert set(rows) == {(young, 0), (young_purged, 0)}
    assert (rows[(young, 0)]["state"], rows[(young_purged, 0)]["state"]) == ("waiting", "purged")
    # on record: the letter it expired, by whom, and what it removed from the table
    latest = (await history(audit_database))[0]
    assert (latest["action"], latest["actor"], latest["state"]) == ("expire", "ops", "done")
    assert latest["letters"] == {"expired": 1}
    assert latest["detail"] == said
    assert latest["filters"] == {"older_than_seconds": 2 * 86400}
    [letter] = (await history(audit_database, latest["operation_id"]))[0]["letter_outcomes"]
    assert (letter["event_id"], letter["outcome"]) == (old, "expired")


async def test_expire_runs_alone_on_its_dlq(broker: Broker, audit_database: str) -> None:
    await dead_letters(broker, kind="schema", ages=[timedelta(days=30)])
    async with Audit.opened(audit_database) as audit:
        replay = await begin(audit, "replay", "alice", {}, vhost=vhost_of(broker.url), queue=DLQ)
        refused = await cli("expire", url=broker.url)
        assert refused.code == 6, refused.err
        assert f"refusing to expire: operation {replay.id} by alice is replaying {DLQ}" in refused.err
        await replay.finish("done")
        expire = await begin(audit, "expire", "retention", {}, vhost=vhost_of(broker.url), queue=DLQ)
        for args in (("replay",), ("purge", "--yes")):
            ran = await cli(*args, url=broker.url)
            assert ran.code == 6, ran.err
            assert f"is expiring letters of {DLQ}" in ran.err
            assert "an expire or repair runs alone on its DLQ: wait for it (it ends on its own)" in ran.err
        await expire.finish("done")
    assert await broker.depth(DLQ) == 1


async def test_the_workers_sweep_expires_once_due_and_skips_while_a_recent_sweep_is_on_record(
    broker: Broker, conn: asyncpg.Connection, audit_database: str
) -> None:
    await dead_letters(broker, kind="internal", ages=[timedelta(days=3)])
    [young] = await dead_letters(broker, kind="internal", ages=[timedelta(minutes=1)])
    settings = Settings(
        postgres_dsn=audit_database, rabbitmq_url=broker.url, dlq_retention="1d", dlq_retention_sweep="1s"
    )
    # two workers' sweeps side by side: the letter goes once, on record as the retention's
    fleet = [RetentionSweeps(settings), RetentionSweeps(settings)]
    for sweeps in fleet:
        sweeps.start()
    try:

        async def expired_and_done() -> bool:
            done = await conn.fetchval(
                "SELECT count(*) FROM ltm_dlq_operations WHERE action = 'expire' AND state = 'done'"
            )
            expired = await conn.fetchval(
                "SELECT count(*) FROM ltm_dlq_operation_letters WHERE outcome = 'expired'"
            )
            return done > 0 and expired > 0

        await eventually(expired_and_done, "a retention sweep done, and the old letter expired")
    finally:
        for sweeps in fleet:
            await sweeps.stop()
    assert await event_ids(broker.url) == [young]
    sweeps_on_record = [op for op in await history(audit_database) if op["action"] == "expire"]
    assert {op["actor"] for op in sweeps_on_record} == {"retention"}
    assert sum(op["letters"].get("expired", 0) for op in sweeps_on_record) == 1
    assert {op["state"] for op in sweeps_on_record} <= {"done", "interrupted"}

    # an hourly sweep that finds one on record a moment ago waits out the hour without sweeping
    hourly = RetentionSweeps(settings.model_copy(update={"dlq_retention_sweep": "1h"}))
    wait = await hourly._look()
    assert 3500 < wait <= 3600 + 60
    assert len([op for op in await history(audit_database) if op["action"] == "expire"]) == len(
        sweeps_on_record
    )


async def test_worker_run_sweeps_beside_the_worker(
    rabbitmq_url: str, redis_url: str, audit_database: str, tmp_path: Path
) -> None:
    env = {
        **cli_env(),
        "LTM_RABBITMQ_URL": rabbitmq_url,
        "LTM_REDIS_URL": redis_url,
        "LTM_DLQ_RETENTION": "1d",
        "LTM_DLQ_RETENTION_SWEEP": "1s",
    }
    process = WorkerProcess(env, tmp_path / "worker.log").start()
    try:
        await process.wait_for_log("consuming")
        connection = await aio_pika.connect(rabbitmq_url)
        try:
            channel = await connection.channel()
            exchange = await channel.get_exchange(TOPOLOGY.dead_letter_exchange)
            for age in (timedelta(days=2), timedelta(hours=1)):
                headers = {
                    "x-ltm-error": "database unavailable",
                    "x-ltm-error-kind": "transient_exhausted",
                    "x-ltm-attempts": 5,
                    "x-ltm-failed-at": rfc3339(datetime.now(UTC) - age),
                }
                await exchange.publish(aio_pika.Message(b"{}", headers=headers), routing_key=MAIN_KEY)
        finally:
            await connection.close()

        def swept() -> bool:
            return any(
                line.get("event") == "retention sweep" and "expired 1 " in line.get("result", "")
                for line in process.lines()
            )

        await eventually(swept, "the worker's retention sweep expires the old letter", timeout=90)
        process.signal(signal.SIGTERM)
        assert await process.wait_exit() == 0
    finally:
        process.kill()
    assert await queue_depth(rabbitmq_url, DLQ) == 1
    swept_on_record = [op for op in await history(audit_database) if op["letters"].get("expired")]
    assert [(op["action"], op["actor"]) for op in swept_on_record] == [("expire", "retention")]
