"""A replay as an operation: its rate, ``worker dlq operations`` and ``cancel`` from another process, one
replay per DLQ at a time, and a rerun that finishes what a replay stopped at once left in doubt.

Against a real RabbitMQ (a fresh vhost per test, with the worker's topology) and a real Postgres (a fresh
migrated database per test for the audit record); every command runs as its own process, as an operator runs
it from a terminal.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from tests.factories import event_body
from tests.integration import test_dlq as base
from tests.integration.test_dlq import (
    MAIN_KEY,
    PIPE,
    TOPOLOGY,
    Broker,
    Ran,
    cli,
    dead_letter_copy,
    event_ids,
    fill_dlq,
    shard_message,
    start_dlq,
)
from tests.integration.test_dlq_oncall import history
from tests.support.wait import eventually
from worker.broker.urls import vhost_of

pytestmark = pytest.mark.integration

broker = base.broker
audit_database = base.audit_database

DLQ = TOPOLOGY.dead_letter_queue


async def on_record(*args: str, timeout: float = 90.0) -> Ran:
    """``python -m worker dlq ARGS`` for the commands that read only the record (operations, cancel)."""
    process = await start_dlq(*args, stdout=PIPE, stderr=PIPE)
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    assert process.returncode is not None
    return Ran(process.returncode, out.decode(), err.decode())


async def running_now() -> list[dict[str, Any]]:
    ran = await on_record("operations", "--json")
    assert ran.code == 0, ran.err
    return [json.loads(line) for line in ran.out.splitlines()]


async def started_replay(*args: str, url: str) -> tuple[asyncio.subprocess.Process, dict[str, Any]]:
    """A replay started in its own process, once ``operations`` lists it running with a letter moved."""
    process = await start_dlq("replay", *args, "--rabbitmq-url", url, stdout=PIPE, stderr=PIPE)
    seen: dict[str, Any] = {}

    async def listed() -> bool:
        assert process.returncode is None, "the replay ended before it could be watched"
        rows = [row for row in await running_now() if row["state"] == "running" and row["moved"] > 0]
        if rows:
            seen.update(rows[0])
        return bool(rows)

    await eventually(listed, "operations lists the replay running", 60, interval=0.1)
    return process, seen


async def test_a_replay_goes_at_its_rate_and_says_so(broker: Broker, audit_database: str) -> None:
    await fill_dlq(broker, 60)
    began = time.monotonic()

    ran = await cli("replay", "--rate", "30", "--progress", "--by", "pat", url=broker.url)

    took = time.monotonic() - began
    assert ran.code == 0, ran.err
    assert ran.out.strip() == "moved 60, kept 0"
    # 60 letters at 30 a second, three a tenth of a second: never faster than 1.9 s (a slower machine only
    # makes it longer)
    assert took >= 1.9, took
    assert "(30/s, " in ran.err
    record = await asyncpg.connect(audit_database)
    try:
        rate, selected, moved = await record.fetchrow("SELECT rate, selected, moved FROM ltm_dlq_operations")
    finally:
        await record.close()
    assert (rate, selected, moved) == (30.0, 60, 60)


async def test_cancel_from_another_terminal_leaves_each_letter_in_one_queue(
    broker: Broker, audit_database: str
) -> None:
    total = 300
    ids = await fill_dlq(broker, total)
    process, running = await started_replay("--rate", "40", "--by", "alice", url=broker.url)
    assert (running["action"], running["actor"], running["rate"], running["expected"]) == (
        "replay",
        "alice",
        40.0,
        total,
    )

    cancelled = await on_record("cancel", running["operation_id"], "--by", "bob")

    assert cancelled.code == 0, cancelled.err
    assert cancelled.out.startswith(f"operation {running['operation_id']} stopped: cancelled at ")
    assert "(cancelled by bob)" in cancelled.out
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 130, err.decode()
    said = out.decode().strip()
    assert said.startswith("cancelled by bob once the letters in flight were settled: moved "), said
    moved = int(said.split("moved ")[1].split(",")[0])
    assert 0 < moved < total

    # every letter is either replayed or still in the DLQ, never both, none lost
    await broker.wait_depth(DLQ, total - moved)
    replayed = [m.message_id for m in await broker.take_all(TOPOLOGY.work_queue)]
    still = await event_ids(broker.url)
    assert len(replayed) == moved
    assert len(still) == total - moved
    assert not set(replayed) & set(still)
    assert sorted(replayed + still) == sorted(ids)
    (entry,) = await history(audit_database)
    assert (entry["state"], entry["detail"], entry["letters"]) == (
        "cancelled",
        "cancelled by bob",
        {"replayed": moved},
    )
    assert await running_now() == []

    again = await cli("replay", "--rate", "0", url=broker.url)  # the rest, as the cancel left it

    assert again.code == 0, again.err
    assert again.out.strip() == f"moved {total - moved}, kept 0"
    arrived = Counter(replayed + [m.message_id for m in await broker.take_all(TOPOLOGY.work_queue)])
    assert set(arrived) == set(ids)
    assert set(arrived.values()) == {1}


async def test_a_second_replay_of_the_same_dlq_is_refused_and_names_the_first(
    broker: Broker, audit_database: str
) -> None:
    await fill_dlq(broker, 200)
    process, running = await started_replay("--rate", "20", "--by", "alice", url=broker.url)
    try:
        second = await cli("replay", "--by", "bob", url=broker.url)

        assert second.code == 6, second.err
        assert second.err.startswith(f"refusing to replay: operation {running['operation_id']} by alice is ")
        assert f"`worker dlq cancel {running['operation_id']}`" in second.err
        assert second.err.rstrip().endswith("nothing was replayed")
        assert second.out == ""
    finally:
        stopped = await on_record("cancel", running["operation_id"])
        assert stopped.code == 0, stopped.err
        await asyncio.wait_for(process.communicate(), 60)


async def test_cancel_says_what_it_cannot_do(broker: Broker, audit_database: str) -> None:
    unknown = await on_record("cancel", str(uuid.uuid4()))
    assert unknown.code == 1
    assert "in the audit record" in unknown.err
    bad = await on_record("cancel", "not-an-id")
    assert bad.code == 2
    assert bad.err == "not an operation id: 'not-an-id' (`worker dlq operations` lists them)\n"

    await fill_dlq(broker, 3)
    assert (await cli("replay", url=broker.url)).code == 0
    (done,) = await history(audit_database)
    finished = await on_record("cancel", done["operation_id"])
    assert finished.code == 0
    assert finished.out.startswith(f"operation {done['operation_id']} is not running: it ended done at ")


async def test_a_rerun_removes_what_a_replay_stopped_at_once_had_sent(
    broker: Broker, audit_database: str
) -> None:
    # the record and the queues as a replay killed mid-round leaves them: letters on record as replayed (their
    # copies confirmed) whose originals were never removed, letters pending (published, no confirm seen) of
    # which the worker answered some and some came back, and letters never taken
    ids = await fill_dlq(broker, 20)
    replayed, answered, came_back, unknown = ids[:5], ids[5:7], ids[7:8], ids[8:10]
    killed = uuid.uuid4()
    record = await asyncpg.connect(audit_database)
    try:
        started = datetime.now(UTC) - timedelta(seconds=30)
        await record.execute(
            "INSERT INTO ltm_dlq_operations (operation_id, action, actor, started_at, filters, vhost, queue,"
            " heartbeat_at) VALUES ($1, 'replay', 'killed', $2, '{}', $3, $4, $2)",
            killed,
            started,
            vhost_of(broker.url),
            DLQ,
        )
        outcomes = [(i, "replayed") for i in replayed]
        outcomes += [(i, "pending") for i in answered + came_back + unknown]
        await record.executemany(
            "INSERT INTO ltm_dlq_operation_letters (operation_id, position, event_id, kind, outcome,"
            " replay_count) VALUES ($1, $2, $3, 'transient_exhausted', $4, 0)",
            [(killed, n, event_id, outcome) for n, (event_id, outcome) in enumerate(outcomes, 1)],
        )
        await record.executemany(
            "INSERT INTO ltm_processed_events (event_id, tool_call_id, tool_name, shard_id, status,"
            " processed_at) VALUES ($1, 'call', 'create_long_term_memory', 3, 'success', now())",
            [(uuid.UUID(event_id),) for event_id in answered],
        )
    finally:
        await record.close()
    # the copy of one pending letter came back to the DLQ (its replay count one more)
    back = came_back[0]
    copy = shard_message(event_body({}, persona_id=7, event_id=back), event_id=back)
    copy.headers["x-ltm-replay-count"] = 1
    await dead_letter_copy(
        broker, copy, MAIN_KEY, kind="transient_exhausted", error="x", attempts=5, failed_at=datetime.now(UTC)
    )
    await broker.wait_depth(DLQ, 21)

    ran = await cli("replay", "--rate", "0", "--by", "rerun", url=broker.url)

    assert ran.code == 0, ran.err
    assert ran.out.strip() == "moved 21, kept 0"
    assert "note: 8 of them had been sent by an earlier replay that was stopped at once" in ran.err
    sent = Counter(m.message_id for m in await broker.take_all(TOPOLOGY.work_queue))
    # sent: the 10 never taken, the 2 pending without evidence, and the copy that came back; not the 8
    assert sent == Counter(ids[10:] + unknown + [back])
    entries = await history(audit_database)
    rerun = next(entry for entry in entries if entry["actor"] == "rerun")
    assert rerun["letters"] == {"replayed": 13, "replayed_before": 8}


async def test_a_replay_that_loses_its_process_is_shown_lost_and_closed_by_cancel(
    broker: Broker, audit_database: str
) -> None:
    await fill_dlq(broker, 200)
    process, running = await started_replay("--rate", "20", url=broker.url)
    process.send_signal(signal.SIGKILL)
    await process.wait()

    (row,) = await running_now()
    assert (row["operation_id"], row["state"]) == (running["operation_id"], "lost")
    closed = await on_record("cancel", running["operation_id"])
    assert closed.code == 0, closed.err
    assert "stopped: interrupted at " in closed.out
    assert "lost: no heartbeat since" in closed.out
    assert await running_now() == []

    async def nothing_held() -> bool:  # what the killed replay held went back: each letter in a queue
        return await broker.depth(DLQ) + await broker.depth(TOPOLOGY.work_queue) >= 200

    await eventually(nothing_held, "the killed replay's letters are back", 30)
