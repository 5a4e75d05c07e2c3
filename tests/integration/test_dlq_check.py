"""``worker dlq check`` and ``worker dlq repair``: the DLQ and the kept letters' waiting rows compared, both
ways, and made to agree on record. Real RabbitMQ (a fresh vhost with the worker's topology) and Postgres (a
fresh migrated database), the worker's own keeper where letters are kept, every command its own process."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import timedelta

import aio_pika
import asyncpg
import pytest

from tests.integration import test_dlq as base
from tests.integration import test_dlq_states as states_base
from tests.integration.test_dlq import TOPOLOGY, Broker, Ran, cli, event_ids
from tests.integration.test_dlq_oncall import history
from tests.integration.test_dlq_states import dead_letters, kept, states
from worker.broker.urls import vhost_of
from worker.ops import dlq
from worker.ops.dlq.audit import Audit, Operation, Taken
from worker.ops.dlq.operations import purge
from worker.ops.dlq.running import begin
from worker.runtime.keeper import Keeper

pytestmark = pytest.mark.integration

broker = base.broker
audit_database = base.audit_database
conn = states_base.conn
keeper = states_base.keeper

DLQ = TOPOLOGY.dead_letter_queue
COPIES = TOPOLOGY.dead_letter_copies_queue


async def check(url: str) -> tuple[int, dict[str, object]]:
    ran = await cli("check", "--json", url=url)
    assert ran.code in (0, 1), ran.err
    found: dict[str, object] = json.loads(ran.out)
    return ran.code, found


async def raw_purge(url: str, queue: str) -> None:
    """What RabbitMQ's own tools do: empty the queue, no worker tool involved."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        await (await channel.get_queue(queue)).purge()
    finally:
        await connection.close()


async def test_letters_whose_copies_never_reached_the_table_are_found_and_kept_by_repair(
    broker: Broker, conn: asyncpg.Connection, audit_database: str
) -> None:
    first, second = await dead_letters(broker, kind="schema", ages=[timedelta(minutes=3)] * 2)
    await broker.wait_depth(COPIES, 2)
    # no keeper ran: the copies wait, and check says the difference may pass on its own
    code, found = await check(broker.url)
    assert code == 1
    assert (found["agree"], found["in_dlq"], found["waiting"]) == (False, 2, 0)
    assert sorted(found["not_kept"]) == sorted([first, second])  # type: ignore[type-var]
    assert (found["copies_waiting"], found["gone"], found["not_waiting"]) == (2, [], [])
    text = await cli("check", url=broker.url)
    assert text.code == 1
    assert "2 copies not kept yet in the copies queue: the keepers are behind" in text.out
    assert "in the DLQ, not kept: 2: " in text.out

    # the copies purged (or the letters dead-lettered before the copies queue existed): only repair keeps them
    await raw_purge(broker.url, COPIES)
    code, found = await check(broker.url)
    assert (code, found["copies_waiting"], len(found["not_kept"])) == (1, 0, 2)  # type: ignore[arg-type]
    repaired = await cli("repair", "--by", "ops", url=broker.url)
    assert repaired.code == 0, repaired.err
    said = "kept 2 letter(s) not kept, set 0 back to waiting, marked 0 purged (gone from the DLQ)"
    assert repaired.out.endswith(said + "\n")
    rows = await states(conn)
    [operation] = await history(audit_database)
    assert (operation["action"], operation["actor"], operation["detail"]) == ("repair", "ops", said)
    for event_id in (first, second):
        row = rows[(event_id, 0)]
        assert (row["state"], row["kind"]) == ("waiting", "schema")
        assert str(row["operation_id"]) == operation["operation_id"]
        assert row["state_detail"] == "kept by `worker dlq repair`: its copy never reached the table"
    assert await check(broker.url) == (0, {**found, "agree": True, "not_kept": [], "waiting": 2})
    assert await event_ids(broker.url) == [first, second]


async def test_rows_whose_letters_left_the_dlq_outside_the_tools_are_found_and_marked_purged(
    broker: Broker, conn: asyncpg.Connection, keeper: Keeper, audit_database: str
) -> None:
    gone = await dead_letters(broker, kind="transient_exhausted", ages=[timedelta(minutes=9)] * 2)
    await kept(conn, 2)
    await raw_purge(broker.url, DLQ)
    [stays] = await dead_letters(broker, kind="schema", ages=[timedelta(minutes=1)])
    await kept(conn, 3)

    code, found = await check(broker.url)
    assert code == 1
    assert (found["in_dlq"], found["waiting"], found["not_kept"]) == (1, 3, [])
    assert sorted(found["gone"]) == sorted(gone)  # type: ignore[type-var]

    repaired = await cli("repair", url=broker.url)
    assert repaired.code == 0, repaired.err
    assert "marked 2 purged (gone from the DLQ)" in repaired.out
    rows = await states(conn)
    for event_id in gone:
        assert rows[(event_id, 0)]["state"] == "purged"
        assert rows[(event_id, 0)]["state_detail"].startswith("gone from the DLQ outside the worker's tools")
    assert rows[(stays, 0)]["state"] == "waiting"
    assert (await check(broker.url))[0] == 0


async def test_a_letter_in_the_dlq_kept_as_gone_is_set_back_to_waiting(
    broker: Broker, conn: asyncpg.Connection, keeper: Keeper
) -> None:
    [letter] = await dead_letters(broker, kind="internal", ages=[timedelta(minutes=2)])
    await kept(conn, 1)
    # an operation recorded it purged, and the broker lost the removal
    await conn.execute("UPDATE ltm_dead_letters SET state = 'purged'")
    code, found = await check(broker.url)
    assert (code, found["not_waiting"]) == (1, [{"event_id": letter, "state": "purged"}])
    repaired = await cli("repair", url=broker.url)
    assert "set 1 back to waiting" in repaired.out, repaired.err
    row = (await states(conn))[(letter, 0)]
    assert row["state"] == "waiting"
    assert row["state_detail"] == "in the DLQ although kept as purged: set back by `worker dlq repair`"
    assert (await check(broker.url))[0] == 0


async def test_repair_is_refused_while_an_operation_runs_and_check_says_it_may_be_transient(
    broker: Broker, audit_database: str
) -> None:
    await dead_letters(broker, kind="schema", ages=[timedelta(minutes=1)])
    async with Audit.opened(audit_database) as audit:
        replay = await begin(audit, "replay", "alice", {}, vhost=vhost_of(broker.url), queue=DLQ)
        refused: Ran = await cli("repair", url=broker.url)
        assert refused.code == 6, refused.err
        assert f"refusing to repair: operation {replay.id} by alice is replaying {DLQ}" in refused.err
        checked = await cli("check", url=broker.url)
        assert checked.code == 1
        assert f"operation {replay.id} (replay by alice) runs on the DLQ" in checked.out
        await replay.finish("done")
    assert await broker.depth(DLQ) == 1


class KilledBeforeTheRecord:
    """An operation's journal whose process dies after the broker removed the letters and before their
    outcome is written: they stay ``pending`` on record."""

    def __init__(self, operation: Operation) -> None:
        self.operation = operation

    async def taking(self, letters: Sequence[Taken]) -> None:
        await self.operation.taking(letters)

    async def settled(
        self, letters: Sequence[Taken], outcome: str, details: Mapping[int, str] | None = None
    ) -> None:
        raise RuntimeError("killed")


async def test_a_letter_an_expire_left_pending_is_marked_expired_by_repair(
    broker: Broker, conn: asyncpg.Connection, keeper: Keeper, audit_database: str
) -> None:
    [old] = await dead_letters(broker, kind="schema", ages=[timedelta(days=20)])
    [young] = await dead_letters(broker, kind="schema", ages=[timedelta(minutes=1)])
    await kept(conn, 2)
    async with Audit.opened(audit_database) as audit:
        expire = await begin(audit, "expire", "retention", {}, vhost=vhost_of(broker.url), queue=DLQ)
        async with dlq.open_dead_letters(broker.url, TOPOLOGY) as queue:
            with pytest.raises(RuntimeError, match="killed"):
                await purge(
                    queue,
                    dlq.Selection(older_than=timedelta(days=14)),
                    journal=KilledBeforeTheRecord(expire),
                    outcome="expired",
                )
        await expire.finish("interrupted", "killed")
    assert await event_ids(broker.url) == [young]
    assert (await states(conn))[(old, 0)]["state"] == "waiting"

    repaired = await cli("repair", url=broker.url)
    assert repaired.code == 0, repaired.err
    assert "marked 1 purged (gone from the DLQ); 1 of them as the purge or expire" in repaired.out
    row = (await states(conn))[(old, 0)]
    assert (row["state"], row["operation_id"]) == ("expired", expire.id)
    assert row["state_detail"] == (
        "expire by retention, stopped at once between its removal and its record: "
        "found by `worker dlq repair`"
    )
    assert (await check(broker.url))[0] == 0
