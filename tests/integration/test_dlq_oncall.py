"""``worker dlq`` for the people on call: groups, the audit record of replay and purge, each command's help.

Against a real RabbitMQ (a fresh vhost per test, filled by ``tests.integration.test_dlq``'s ``seeded``: five
dead letters A..E of five kinds, the way production makes them) and a real Postgres (a fresh migrated
database per test for the audit record).
"""

from __future__ import annotations

import asyncio
import io
import json
import signal
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from tests.integration import test_dlq as base
from tests.integration.test_dlq import (
    TOPOLOGY,
    Broker,
    Seeded,
    add_schema_letters,
    cli,
    event_ids,
    fill_dlq,
    json_lines,
    replay_until,
    start_dlq,
)
from tests.integration.test_dlq_page import ui
from tests.integration.test_dlq_page_guard import request
from tests.services import Services
from tests.support.wait import eventually
from worker.broker.headers import Sender
from worker.broker.publisher import Publisher
from worker.broker.urls import vhost_of
from worker.ops import dlq
from worker.ops.dlq.audited import Audited
from worker.ops.dlq.selection import normalise_error

pytestmark = pytest.mark.integration

# test_dlq's fixtures: the vhost with the worker's topology, its five dead letters, the audit database
broker = base.broker
seeded = base.seeded
audit_database = base.audit_database

DLQ = TOPOLOGY.dead_letter_queue


# --- groups ---------------------------------------------------------------------------------------------


def test_error_groups_strip_ids_and_numbers() -> None:
    assert normalise_error("unknown schema_version 2") == normalise_error("unknown schema_version 17")
    assert normalise_error(f"event_id {uuid.uuid4()} is not canonical") == "event_id <id> is not canonical"
    assert normalise_error("KeyError: 'persona'") == "KeyError: 'persona'"  # the class and text stay
    assert normalise_error("timed out after 30.5s") != normalise_error("connection refused")
    assert dlq.Selection(groups=frozenset({("shard", "none")})).describe() == {"group": ["shard=none"]}


async def test_list_group_by_counts_each_group(broker: Broker, seeded: Seeded) -> None:
    extra = await add_schema_letters(broker, [7, 9, 11])
    await broker.wait_depth(DLQ, 8)

    kinds = {
        g["group"]: g for g in json_lines(await cli("list", "--group-by", "kind", "--json", url=broker.url))
    }
    assert {k: g["count"] for k, g in kinds.items()} == {
        "schema": 4,
        "transient_exhausted": 1,
        "internal": 1,
        "malformed": 1,
        "delivery_limit": 1,
    }
    schema = kinds["schema"]
    assert schema["sample_event_id"] == seeded.ids["B"]  # the first of the group the pass met
    assert schema["selector"] == "kind=schema"
    assert schema["replay"] == "worker dlq replay --group kind=schema"
    oldest, newest = (
        datetime.fromisoformat(schema[k].replace("Z", "+00:00"))
        for k in ("oldest_failed_at", "newest_failed_at")
    )
    assert timedelta(minutes=29) < datetime.now(UTC) - oldest < timedelta(minutes=31)  # the first extra one
    assert timedelta(minutes=4) < datetime.now(UTC) - newest < timedelta(minutes=6)  # B

    errors = json_lines(await cli("list", "--group-by", "error", "--json", url=broker.url))
    assert errors[0]["group"] == "unknown schema_version <n>"
    assert errors[0]["count"] == 4  # largest first
    assert errors[0]["replay"] == "worker dlq replay --group 'error=unknown schema_version <n>'"
    assert sum(g["count"] for g in errors) == 8

    shards = {
        g["group"]: g["count"]
        for g in json_lines(await cli("list", "--group-by", "shard", "--json", url=broker.url))
    }
    assert shards == {"3": 1, "4": 1, "5": 1, "none": 1, "6": 1, "9": 3}

    human = await cli("list", "--group-by", "kind", "--kind", "schema,malformed", url=broker.url)
    assert human.code == 0, human.err
    header, *rows = human.out.splitlines()
    assert header.split() == ["COUNT", "OLDEST", "NEWEST", "SAMPLE_EVENT_ID", "REPLAY_HELPS", "GROUP"]
    assert [(row.split()[0], row.split()[-2], row.split()[-1]) for row in rows] == [
        ("4", "no", "kind=schema"),
        ("1", "no", "kind=malformed"),
    ]
    first, note = human.err.splitlines()
    assert first == "5 of 8 dead letters in ltm.create_memory.dlq, 2 group(s) by kind"
    assert note.startswith("REPLAY_HELPS no: a replay of the group fails again")
    # grouping reads like list: the queue is as it was, in its order
    assert await event_ids(broker.url) == [*seeded.order(*"ABCDE"), *extra]


@pytest.mark.slow
async def test_a_group_selects_what_it_counts(broker: Broker, seeded: Seeded) -> None:
    extra = await add_schema_letters(broker, [3, 4])
    await broker.wait_depth(DLQ, 7)

    listed = json_lines(
        await cli("list", "--json", "--group", "error=unknown schema_version <n>", url=broker.url)
    )
    assert [x["event_id"] for x in listed] == [seeded.ids["B"], *extra]
    both = json_lines(
        await cli("list", "--json", "--group", "shard=9", "--group", "shard=none", url=broker.url)
    )
    assert [x["event_id"] for x in both] == [seeded.ids["D"], *extra]
    anded = json_lines(
        await cli("list", "--json", "--group", "kind=schema", "--group", "shard=4", url=broker.url)
    )
    assert [x["event_id"] for x in anded] == [seeded.ids["B"]]

    dry = await cli("replay", "--group", "kind=schema", "--dry-run", url=broker.url)
    assert dry.code == 0, dry.err
    assert [line.split()[0] for line in dry.out.splitlines()[1:-1]] == [seeded.ids["B"], *extra]
    assert dry.out.splitlines()[-1] == "dry run: would move 3, keep 4; nothing moved"

    bad = await cli("list", "--group", "colour=red", url=broker.url)
    assert bad.code == 2
    assert "not a group: 'colour=red'" in bad.err

    replayed = await cli("replay", "--group", "shard=9", url=broker.url)
    assert (replayed.code, replayed.out) == (0, "moved 2, kept 5\n"), replayed.err
    assert await event_ids(broker.url) == seeded.order(*"ABCDE")


# --- the audit record --------------------------------------------------------------------------------------


async def history(dsn: str, *args: str) -> list[dict[str, Any]]:
    out = io.StringIO()
    code = await dlq.history_command(dsn, console=dlq.Console(out=out, err=io.StringIO()), **_opts(args))
    assert code == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def _opts(args: tuple[str, ...]) -> dict[str, Any]:
    return {"as_json": True, **({"operation": args[0]} if args else {})}


async def test_replay_and_purge_are_on_record(broker: Broker, seeded: Seeded, audit_database: str) -> None:
    replayed = await cli("replay", "--group", "kind=schema", "--by", "alice", url=broker.url)
    assert (replayed.code, replayed.out) == (0, "moved 1, kept 4\n"), replayed.err
    purged = await cli("purge", "--yes", "--kind", "malformed,delivery_limit", url=broker.url)
    assert (purged.code, purged.out) == (0, "deleted 2, kept 2\n"), purged.err
    refused = await cli("purge", "--kind", "internal", url=broker.url)  # no terminal, no --yes
    assert refused.code == 2

    purge_refused, purge, replay = await history(audit_database)
    assert (replay["action"], replay["actor"], replay["state"]) == ("replay", "alice", "done")
    assert replay["filters"] == {"group": ["kind=schema"]}
    assert replay["letters"] == {"replayed": 1}
    assert (replay["vhost"], replay["queue"], replay["expected"], replay["scanned"]) == (
        vhost_of(broker.url), DLQ, 5, 5,
    )  # fmt: skip
    assert (purge["action"], purge["state"], purge["letters"]) == ("purge", "done", {"deleted": 2})
    assert "@" in purge["actor"]  # user@host when --by does not say
    assert purge["filters"] == {"kind": ["delivery_limit", "malformed"]}
    assert purge_refused["state"] == "refused"
    assert purge_refused["letters"] == {}
    assert purge_refused["detail"] == "stdin is not a terminal, so there is no one to confirm"

    (detail,) = await history(audit_database, purge["operation_id"])
    outcomes = [(x["event_id"], x["kind"], x["outcome"]) for x in detail["letter_outcomes"]]
    assert outcomes == [
        (seeded.ids["D"], "malformed", "deleted"),
        (seeded.ids["E"], "delivery_limit", "deleted"),
    ]

    out = io.StringIO()
    assert await dlq.history_command(audit_database, console=dlq.Console(out, io.StringIO())) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert "replay  done         by alice  [replayed 1]  group=kind=schema" in lines[2]


async def test_a_declined_purge_is_on_record_with_what_it_kept(
    broker: Broker, seeded: Seeded, audit_database: str
) -> None:
    async def no(_prompt: str) -> str:
        return "n"

    audit = Audited(audit_database, "bob@desk")
    out, err = io.StringIO(), io.StringIO()
    code = await dlq.purge_command(
        broker.url, TOPOLOGY, dlq.Selection(older_than=timedelta(hours=1)), yes=False, ask=no, audit=audit,
        console=dlq.Console(out=out, err=err),
    )  # fmt: skip
    assert code == 1, err.getvalue()
    (entry,) = await history(audit_database)
    assert (entry["state"], entry["detail"], entry["actor"]) == ("refused", "not confirmed", "bob@desk")
    (detail,) = await history(audit_database, entry["operation_id"])
    assert [(x["event_id"], x["outcome"]) for x in detail["letter_outcomes"]] == [
        (seeded.ids["A"], "kept"), (seeded.ids["D"], "kept"),
    ]  # fmt: skip
    assert await broker.depth(DLQ) == 5


async def test_no_audit_record_no_replay(broker: Broker, seeded: Seeded, test_services: Services) -> None:
    """Postgres unreachable, or the audit tables missing: replay and purge refuse, the DLQ is untouched."""
    async with test_services.fresh_database() as unmigrated:
        for dsn, why in (
            (
                "postgresql://postgres@127.0.0.1:1/postgres",
                "cannot reach Postgres at postgresql://postgres@127.0.0.1:1/postgres",
            ),
            (unmigrated, "do not exist in"),
        ):
            for args, verb in ((("replay",), "replay"), (("purge", "--yes"), "purge")):
                ran = await cli(*args, "--postgres-dsn", dsn, url=broker.url)
                assert ran.code == 5, ran.err
                assert ran.err.startswith(f"refusing to {verb}: "), ran.err
                assert why in ran.err, ran.err
                assert ran.out == ""
    assert await event_ids(broker.url) == seeded.order(*"ABCDE")
    assert await broker.depth(TOPOLOGY.work_queue) == 0
    # a dry run records nothing, so it needs no database
    dry = await cli(
        "replay", "--dry-run", "--postgres-dsn", "postgresql://postgres@127.0.0.1:1/x", url=broker.url
    )
    assert dry.code == 0, dry.err


async def test_an_audit_write_refused_mid_way_stops_the_replay(
    broker: Broker, seeded: Seeded, audit_database: str
) -> None:
    """Postgres refuses the third letter's row: two letters are replayed and on record, the third and the
    rest never left the DLQ, and the operation says it failed."""
    conn = await asyncpg.connect(audit_database)
    try:
        await conn.execute(
            """
            CREATE FUNCTION refuse_third() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.position >= 3 THEN RAISE EXCEPTION 'audit disk full (test)'; END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER refuse_third BEFORE INSERT ON ltm_dlq_operation_letters
                FOR EACH ROW EXECUTE FUNCTION refuse_third();
            """
        )
    finally:
        await conn.close()

    ran = await cli("replay", "--batch", "1", url=broker.url)

    assert ran.code == 5, ran.err
    assert "stopped: cannot write the audit record" in ran.err
    assert "audit disk full (test)" in ran.err
    assert await event_ids(broker.url) == seeded.order(*"CDE")
    assert await broker.depth(TOPOLOGY.work_queue) == 2
    (entry,) = await history(audit_database)
    assert (entry["state"], entry["letters"]) == ("failed", {"replayed": 2})
    assert "audit disk full (test)" in entry["detail"]


async def test_a_killed_replay_leaves_a_record_that_says_how_far_it_got(
    broker: Broker, audit_database: str
) -> None:
    total = 2000
    await fill_dlq(broker, total)
    process = await replay_until(broker, 300)
    process.send_signal(signal.SIGKILL)
    assert await process.wait() == -signal.SIGKILL

    (entry,) = await history(audit_database)
    assert entry["state"] == "started"
    assert entry["finished_at"] is None  # never finished
    done, pending = entry["letters"].get("replayed", 0), entry["letters"].get("pending", 0)
    assert done >= 200
    assert pending <= 100  # at most the batch in flight is in doubt
    assert done + pending < total, "the replay finished before the kill; the test proves nothing"
    # every letter on record as replayed did reach the work queue
    assert await broker.depth(TOPOLOGY.work_queue) >= done


async def test_a_first_ctrl_c_settles_the_round_in_flight_then_stops_on_record(
    broker: Broker, audit_database: str
) -> None:
    total = 2000
    await fill_dlq(broker, total)
    # The replay's fourth batch waits on a lock the test holds, so Ctrl-C always lands mid-round however fast
    # or slow the machine is: a trigger on the audit's letters blocks once 300 are on record. Ctrl-C is sent
    # once the replay waits there (three batches replayed and settled on record), not as soon as 300 are in
    # the work queue: the third batch is confirmed there before it is settled on record.
    gate = await asyncpg.connect(audit_database)
    try:
        await gate.execute(
            """
            CREATE FUNCTION test_hold_the_replay() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF (SELECT count(*) FROM ltm_dlq_operation_letters) >= 300 THEN
                    PERFORM pg_advisory_xact_lock(4242);
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER test_hold_the_replay BEFORE INSERT ON ltm_dlq_operation_letters
                FOR EACH ROW EXECUTE FUNCTION test_hold_the_replay();
            """
        )
        await gate.execute("SELECT pg_advisory_lock(4242)")
        process = await replay_until(broker, 300, stderr=asyncio.subprocess.PIPE)
        assert process.stderr is not None

        async def waiting_at_the_gate() -> bool:
            return bool(
                await gate.fetchval(
                    "SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242"
                    " AND NOT granted"
                    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                )
            )

        async def reached_the_gate() -> bool:
            assert process.returncode is None, "the replay ended before it reached the gate"
            return await waiting_at_the_gate()

        await eventually(reached_the_gate, "the replay waits at the gate", 30, interval=0.01)
        process.send_signal(signal.SIGINT)
        said = await asyncio.wait_for(process.stderr.readline(), 30)
        while said.strip() == b"":
            said = await asyncio.wait_for(process.stderr.readline(), 30)
        assert said.decode().strip() == (
            "stopping once the letters in flight are settled; Ctrl-C again stops at once"
        )
        # the round waiting at the gate is not abandoned half-done: it goes on once the gate opens
        assert await waiting_at_the_gate()
        await gate.execute("SELECT pg_advisory_unlock(4242)")
    finally:
        await gate.close()
    rest = await asyncio.wait_for(process.stderr.read(), 60)
    assert await asyncio.wait_for(process.wait(), 60) == 130
    assert "interrupted; dead letters not yet settled stay in the DLQ" in rest.decode()

    (entry,) = await history(audit_database)
    assert (entry["state"], entry["detail"]) == ("interrupted", "interrupted (Ctrl-C)")
    # the fourth round was settled (copies confirmed, originals removed), and nothing is in doubt
    assert entry["letters"] == {"replayed": 400}
    assert await broker.depth(TOPOLOGY.work_queue) == 400
    await broker.wait_depth(DLQ, total - 400)  # the rest is back, none held
    assert await broker.depth(DLQ) == total - 400


async def test_a_ctrl_c_whose_cancellation_was_lost_stops_the_replay_at_the_next_batch(
    broker: Broker, audit_database: str
) -> None:
    # Ctrl-C's cancellation can be swallowed by a task the replay awaits (aiormq's RPC tasks, Python 3.11's
    # wait_for); the flag the signal sets is asked between batches all the same. Here the flag is set after
    # three batches and no cancellation comes at all.
    total = 100
    await fill_dlq(broker, total)
    asked = 0

    def stop() -> bool:  # asked before each batch is taken and again before it moves
        nonlocal asked
        asked += 1
        return asked > 6

    err = io.StringIO()
    with pytest.raises(asyncio.CancelledError):
        await dlq.commands.replay_command(
            broker.url,
            TOPOLOGY,
            dlq.Selection(),
            batch=10,
            audit=Audited(audit_database, "carol"),
            console=dlq.Console(out=io.StringIO(), err=err),
            stop=stop,
        )

    (entry,) = await history(audit_database)
    assert (entry["state"], entry["detail"]) == ("interrupted", "interrupted (Ctrl-C)")
    assert entry["letters"] == {"replayed": 30}
    assert await broker.depth(TOPOLOGY.work_queue) == 30
    await broker.wait_depth(DLQ, total - 30)  # the rest is back, none held
    assert await broker.depth(DLQ) == total - 30


# --- replays that came back -------------------------------------------------------------------------------


async def refuse_again(broker: Broker) -> str:
    """What the worker does with a replayed letter it refuses again: dead-letter it (keeping its replay
    count); its event id."""
    message = await broker.declared.work_queue.get(timeout=5)
    publisher = Publisher.for_topology(broker.channel, broker.declared)
    await publisher.dead_letter(
        message, kind="malformed", error="body is not UTF-8 JSON", attempts=1, sender=Sender(None)
    )
    await message.ack()
    return str(message.message_id)


@pytest.mark.slow
async def test_history_says_which_replayed_letters_came_back(
    broker: Broker, seeded: Seeded, audit_database: str
) -> None:
    """Newcomer review F12: a replay of a malformed letter was 'done' although the letter was back in the DLQ
    a moment later. The record keeps each letter's replay count; history matches the replayed copy."""
    replayed = await cli("replay", "--kind", "malformed", "--by", "nc4", url=broker.url)
    assert (replayed.code, replayed.out) == (0, "moved 1, kept 4\n"), replayed.err
    assert "note: 1 of them (1 malformed) will fail again" in replayed.err
    kept = await cli("replay", "--kind", "transient_exhausted", url=broker.url)  # no worker: it stays away
    assert kept.code == 0, kept.err
    assert await refuse_again(broker) == seeded.ids["D"]
    await broker.wait_depth(DLQ, 4)

    ran = await cli("history", "--json", url=broker.url)
    assert ran.code == 0, ran.err
    transient, malformed = json_lines(ran)
    assert (malformed["actor"], malformed["state"], malformed["letters"]) == ("nc4", "done", {"replayed": 1})
    assert (malformed["came_back"], malformed["came_back_checked"]) == (1, True)
    assert (transient["came_back"], transient["letters"]) == (0, {"replayed": 1})
    human = await cli("history", url=broker.url)
    assert "[replayed 1 (1 came back to the DLQ: its replay failed again)]" in human.out
    (detail,) = json_lines(
        await cli("history", "--json", "--operation", malformed["operation_id"], url=broker.url)
    )
    [letter] = detail["letter_outcomes"]
    assert (letter["event_id"], letter["outcome"], letter["replay_count"], letter["came_back"]) == (
        seeded.ids["D"], "replayed", 0, True,
    )  # fmt: skip

    # the page says so too, from the pass it makes anyway
    async with ui(broker.url) as page:
        bearer = {"Authorization": f"Bearer {page.token}"}
        _, overview = await asyncio.to_thread(request, page.base, "/", bearer)
        assert f"data-operation='{malformed['operation_id']}' data-came-back='1'" in overview
        assert f"data-operation='{transient['operation_id']}' data-came-back='0'" in overview
        path = f"/history?operation={malformed['operation_id']}"
        _, letters = await asyncio.to_thread(request, page.base, path, bearer)
        assert "replayed, came back to the DLQ: its replay failed again" in letters

    # once a purge took the letter that came back, the record alone says it: no DLQ needed
    purged = await cli("purge", "--yes", "--kind", "malformed", url=broker.url)
    assert purged.code == 0, purged.err
    unreachable = "amqp://guest:guest@127.0.0.1:1/"
    ran = await cli("history", "--json", url=unreachable)
    assert ran.code == 0, ran.err
    _, _, malformed = json_lines(ran)
    assert (malformed["came_back"], malformed["came_back_checked"]) == (1, False)
    # the transient letter's replay cannot be settled without the DLQ: history says it could not look
    assert "could not read the DLQ to see which replayed letters came back (cannot reach RabbitMQ" in ran.err


# --- help -----------------------------------------------------------------------------------------------


async def test_each_help_names_only_the_settings_it_reads() -> None:
    logs = {"LTM_LOG_FORMAT", "LTM_LOG_LEVEL"}  # every command logs
    # who published a letter reads LTM_TRUSTED_PUBLISHERS; a replay under LTM_SHARD_IDENTITY=required refuses
    # a letter without a known sender
    identity = {"LTM_SHARD_IDENTITY", "LTM_TRUSTED_PUBLISHERS"}
    reads = {
        (): {"LTM_RABBITMQ_URL", "LTM_POSTGRES_DSN"} | identity | logs,
        ("list",): {"LTM_RABBITMQ_URL", "LTM_POSTGRES_DSN"} | logs,
        ("show",): {"LTM_RABBITMQ_URL", "LTM_POSTGRES_DSN", "LTM_TRUSTED_PUBLISHERS"} | logs,
        ("replay",): {"LTM_RABBITMQ_URL", "LTM_POSTGRES_DSN"} | identity | logs,
        ("purge",): {"LTM_RABBITMQ_URL", "LTM_POSTGRES_DSN"} | logs,
        ("history",): {"LTM_POSTGRES_DSN", "LTM_RABBITMQ_URL"} | logs,  # the DLQ: which replays came back
        ("ui",): {"LTM_RABBITMQ_URL", "LTM_POSTGRES_DSN", "LTM_TRUSTED_PUBLISHERS"} | logs,
    }
    for action, expected in reads.items():
        process = await start_dlq(*action, "--help", stdout=asyncio.subprocess.PIPE)
        out, _ = await process.communicate()
        assert process.returncode == 0
        text = out.decode()
        named = {word.strip(",.:;()") for word in text.split() if word.startswith(("LTM_", "MAX_"))}
        named = {name.partition("=")[0].removesuffix("_FILE") for name in named}  # LTM_X=value names LTM_X
        assert named == expected, (action, named)
