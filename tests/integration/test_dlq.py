"""``worker dlq``: list, show, purge and replay against a real RabbitMQ (a fresh vhost per test).

The DLQ is filled the way production fills it: the worker's own ``Publisher`` (dead letter after a real
trip through a retry queue), copies published to ``tomori.dead_letter`` with the ``x-ltm-*`` headers the
worker adds (to back-date ``x-ltm-failed-at``), and one message the broker dead-lettered itself by going
over the work queue's delivery limit (x-death, no ``x-ltm-*`` headers).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import sys
import time
import tracemalloc
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import aio_pika
import asyncpg
import pytest
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from tests.factories import event_body
from worker.broker.headers import ORIGINAL_ROUTING_KEY, REPLAY_COUNT, REPLAYED_AT, Sender, rfc3339
from worker.broker.publisher import Publisher
from worker.broker.topology import Declared, declare_topology, retry_queue_name
from worker.broker.urls import vhost_of
from worker.config import Topology
from worker.ops import dlq
from worker.testing.dead_letters import keep_copies

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TOPOLOGY = Topology()
EVERY = dlq.Selection()
MAIN_KEY = "tool.create_long_term_memory"
ALIAS_KEY = "tool.remember_this_fact"
RETRY_DELAY_MS = 1000
JSON_KEYS = {"event_id", "kind", "error", "attempts", "failed_at", "shard_id", "routing_key"}
MALFORMED = b"\xff\xfe not json"
DEAD_LETTER_HEADERS = {"x-ltm-error", "x-ltm-error-kind", "x-ltm-failed-at", "x-ltm-attempts"}

#: a copy of an event that carried no user_id (x-ltm-user-id "")
NO_SENDER = Sender(None)


# --- the broker side ------------------------------------------------------------------------------------


@dataclass
class Broker:
    """A connection to the test vhost with the worker's topology declared."""

    url: str
    connection: aio_pika.abc.AbstractConnection
    channel: AbstractChannel
    declared: Declared

    async def depth(self, queue: str) -> int:
        declared = await self.channel.declare_queue(queue, passive=True)
        return int(declared.declaration_result.message_count or 0)

    async def wait_depth(self, queue: str, at_least: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while await self.depth(queue) < at_least:
            assert time.monotonic() < deadline, f"{queue} never reached {at_least} messages"
            await asyncio.sleep(0.02)

    async def take_all(self, queue_name: str) -> list[AbstractIncomingMessage]:
        """Consume (auto-ack) everything in ``queue_name`` until it has been quiet for half a second."""
        channel = await self.connection.channel()
        await channel.set_qos(prefetch_count=1000)
        queue = await channel.get_queue(queue_name)
        taken: list[AbstractIncomingMessage] = []
        async with queue.iterator(no_ack=True) as messages:
            while True:
                try:
                    taken.append(await asyncio.wait_for(messages.__anext__(), timeout=0.5))
                except TimeoutError:
                    break
        await channel.close()
        return taken


@pytest.fixture
async def broker(rabbitmq_url: str) -> AsyncIterator[Broker]:
    connection = await aio_pika.connect(rabbitmq_url)
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    # delivery limit 1: the broker dead-letters a message on its second rejection
    declared = await declare_topology(channel, TOPOLOGY, [RETRY_DELAY_MS], delivery_limit=1)
    try:
        yield Broker(rabbitmq_url, connection, channel, declared)
    finally:
        await connection.close()


def shard_message(body: dict[str, Any] | bytes, *, event_id: str) -> aio_pika.Message:
    """A tool-call event with the AMQP properties of CONTRACT.md."""
    return aio_pika.Message(
        body if isinstance(body, bytes) else json.dumps(body).encode(),
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=event_id,
        correlation_id=f"call_{event_id[:8]}",
        type="tool_call.v1",
        timestamp=datetime(2026, 12, 2, 8, 0, tzinfo=UTC),
        app_id="tomori-shard-3",
        headers={"traceparent": f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"},
    )


async def dead_letter_copy(
    broker: Broker,
    message: aio_pika.Message,
    routing_key: str,
    *,
    kind: str,
    error: str,
    attempts: int,
    failed_at: datetime,
) -> None:
    """What ``Publisher.dead_letter`` publishes, with a chosen failure time."""
    message.headers = {
        **(message.headers or {}),
        "x-ltm-error": error,
        "x-ltm-error-kind": kind,
        "x-ltm-attempts": attempts,
        "x-ltm-failed-at": rfc3339(failed_at),
    }
    await broker.declared.dead_letter.publish(message, routing_key, mandatory=True)


@dataclass
class Seeded:
    """The five dead letters every test starts with, in queue order A..E."""

    ids: dict[str, str]
    #: the message each shard published, by letter
    sent: dict[str, aio_pika.Message] = field(default_factory=dict)

    def order(self, *letters: str) -> list[str]:
        return [self.ids[letter] for letter in letters]


@pytest.fixture
async def seeded(broker: Broker) -> Seeded:
    now = datetime.now(UTC)
    ids = {letter: str(uuid.uuid4()) for letter in "ABCDE"}
    seed = Seeded(ids)

    def body(letter: str, shard: int) -> dict[str, Any]:
        return event_body({"memory_content": "x"}, persona_id=7, event_id=ids[letter], shard_id=shard)

    # A: transient faults outlasted every retry, two hours ago
    seed.sent["A"] = shard_message(body("A", 3), event_id=ids["A"])
    await dead_letter_copy(
        broker,
        seed.sent["A"],
        MAIN_KEY,
        kind="transient_exhausted",
        error="database unavailable: connection refused",
        attempts=5,
        failed_at=now - timedelta(hours=2),
    )
    # B: a schema error five minutes ago, sent with the alias routing key
    seed.sent["B"] = shard_message(body("B", 4), event_id=ids["B"])
    await dead_letter_copy(
        broker,
        seed.sent["B"],
        ALIAS_KEY,
        kind="schema",
        error="unknown schema_version 2",
        attempts=1,
        failed_at=now - timedelta(minutes=5),
    )
    # C: the worker's own path: a trip through a retry queue (broker x-death, x-ltm-routing-key),
    # then Publisher.dead_letter
    publisher = Publisher.for_topology(broker.channel, broker.declared)
    seed.sent["C"] = shard_message(body("C", 5), event_id=ids["C"])
    await broker.declared.tool_calls.publish(seed.sent["C"], ALIAS_KEY)
    first = await broker.declared.work_queue.get(timeout=5)
    await publisher.retry_later(
        first, queue=retry_queue_name(TOPOLOGY, RETRY_DELAY_MS), attempts=1, delay_ms=1, sender=NO_SENDER
    )
    await first.ack()
    await broker.wait_depth(TOPOLOGY.work_queue, 1)
    second = await broker.declared.work_queue.get(timeout=5)
    assert second.headers.get("x-death"), "the retry trip should have left an x-death header"
    await publisher.dead_letter(
        second, kind="internal", error="KeyError: 'persona'", attempts=2, sender=NO_SENDER
    )
    await second.ack()
    # D: not JSON at all, three days ago
    await dead_letter_copy(
        broker,
        shard_message(MALFORMED, event_id=ids["D"]),
        MAIN_KEY,
        kind="malformed",
        error="body is not UTF-8 JSON",
        attempts=1,
        failed_at=now - timedelta(days=3),
    )
    # E: the broker's own dead letter: redelivered past the work queue's delivery limit
    seed.sent["E"] = shard_message(body("E", 6), event_id=ids["E"])
    await broker.declared.tool_calls.publish(seed.sent["E"], ALIAS_KEY)
    while (poison := await broker.declared.work_queue.get(fail=False, timeout=5)) is not None:
        await poison.reject(requeue=True)
    await broker.wait_depth(TOPOLOGY.dead_letter_queue, 5)
    return seed


async def add_schema_letters(broker: Broker, versions: list[int], *, shard: int = 9) -> list[str]:
    """Dead letters whose errors differ only by a number (one error group), from shard ``shard``."""
    ids = []
    for n, version in enumerate(versions):
        event_id = str(uuid.uuid4())
        ids.append(event_id)
        body = event_body({"memory_content": "x"}, persona_id=7, event_id=event_id, shard_id=shard)
        await dead_letter_copy(
            broker,
            shard_message(body, event_id=event_id),
            MAIN_KEY,
            kind="schema",
            error=f"unknown schema_version {version}",
            attempts=1,
            failed_at=datetime.now(UTC) - timedelta(minutes=30 - n),
        )
    return ids


def json_lines(ran: Ran) -> list[dict[str, Any]]:
    assert ran.code == 0, ran.err
    return [json.loads(line) for line in ran.out.splitlines()]


# --- calling the tool -------------------------------------------------------------------------------------


async def letters(url: str, selection: dlq.Selection = EVERY) -> list[dlq.Letter]:
    found: list[dlq.Letter] = []
    async with dlq.open_dead_letters(url, TOPOLOGY) as queue:
        await dlq.browse(queue, selection, lambda item, _now: found.append(item.letter))
    return found


async def event_ids(url: str, selection: dlq.Selection = EVERY) -> list[str | None]:
    return [letter.event_id for letter in await letters(url, selection)]


@dataclass
class Ran:
    code: int
    out: str
    err: str


#: the audit database of the running test: `replay` and `purge` refuse to run without one
_AUDIT: dict[str, str] = {}


@pytest.fixture(autouse=True)
async def audit_database(migrated_dsn: str) -> AsyncIterator[str]:
    """A migrated database for the audit record of every `replay` and `purge` the test runs."""
    _AUDIT["dsn"] = migrated_dsn
    yield migrated_dsn
    _AUDIT.clear()


def cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LTM_", "MAX_"))}
    env["PYTHONUNBUFFERED"] = "1"
    if "dsn" in _AUDIT:
        env["LTM_POSTGRES_DSN"] = _AUDIT["dsn"]
    return env


PIPE, DEVNULL = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL


def _sigint_as_from_a_terminal() -> None:
    # a run started as a script's background job has SIGINT ignored, and a command rightly keeps it so: the
    # tests that press Ctrl-C want it as a terminal gives it
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def start_dlq(*args: str, stdout: int = DEVNULL, stderr: int = DEVNULL) -> asyncio.subprocess.Process:
    """``python -m worker dlq ARGS`` started in the repository, with :func:`cli_env`, no stdin and SIGINT
    as a terminal gives it."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "worker", "dlq", *args),
        cwd=REPO,
        env=cli_env(),
        stdin=DEVNULL,
        stdout=stdout,
        stderr=stderr,
        preexec_fn=_sigint_as_from_a_terminal,
    )


async def fill_dlq(broker: Broker, total: int) -> list[str]:
    """``total`` worker dead letters (transient_exhausted, a minute old) in the DLQ; their event ids."""
    failed_at = datetime.now(UTC) - timedelta(minutes=1)
    ids = [str(uuid.uuid4()) for _ in range(total)]
    for start in range(0, total, 500):
        await asyncio.gather(
            *(
                dead_letter_copy(
                    broker,
                    shard_message(event_body({}, persona_id=7, event_id=event_id), event_id=event_id),
                    MAIN_KEY,
                    kind="transient_exhausted",
                    error="database unavailable",
                    attempts=5,
                    failed_at=failed_at,
                )
                for event_id in ids[start : start + 500]
            )
        )
    await broker.wait_depth(TOPOLOGY.dead_letter_queue, total)
    return ids


async def replay_until(broker: Broker, moved: int, *, stderr: int = DEVNULL) -> asyncio.subprocess.Process:
    """A `worker dlq replay --batch 100 --rate 0` (as fast as confirms) that has moved at least ``moved``
    letters, still running."""
    process = await start_dlq(
        "replay", "--batch", "100", "--rate", "0", "--rabbitmq-url", broker.url, stderr=stderr
    )
    deadline = time.monotonic() + 60
    while await broker.depth(TOPOLOGY.work_queue) < moved:
        assert process.returncode is None, "replay exited before it could be stopped"
        assert time.monotonic() < deadline, "replay made no progress"
        await asyncio.sleep(0.01)
    return process


async def cli(*args: str, url: str, timeout: float = 60.0) -> Ran:
    """``python -m worker dlq ARGS --rabbitmq-url URL`` with no terminal on stdin; before a list or a show
    (which read the kept letters), the copies of the dead letters the test made are kept, as a running
    worker would have kept them."""
    if "dsn" in _AUDIT and args[:1] in (("list",), ("show",)):
        await keep_copies(url, _AUDIT["dsn"])
    process = await start_dlq(*args, "--rabbitmq-url", url, stdout=PIPE, stderr=PIPE)
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    assert process.returncode is not None
    return Ran(process.returncode, out.decode(), err.decode())


# --- list -------------------------------------------------------------------------------------------------


async def test_list_reads_worker_and_broker_dead_letters(broker: Broker, seeded: Seeded) -> None:
    found = await letters(broker.url)

    by_id = {letter.event_id: letter for letter in found}
    assert [letter.event_id for letter in found] == seeded.order(*"ABCDE")
    a, b, c, d, e = (by_id[seeded.ids[x]] for x in "ABCDE")
    assert (a.kind, a.attempts, a.shard_id, a.routing_key) == ("transient_exhausted", 5, 3, MAIN_KEY)
    assert a.error == "database unavailable: connection refused"
    assert (b.kind, b.shard_id, b.routing_key) == ("schema", 4, ALIAS_KEY)
    assert (c.kind, c.attempts, c.shard_id, c.routing_key) == ("internal", 2, 5, ALIAS_KEY)
    assert (d.kind, d.shard_id, d.routing_key) == ("malformed", None, MAIN_KEY)  # id from message_id
    assert (e.kind, e.error) == ("delivery_limit", "redelivered more than the delivery limit")
    assert (e.attempts, e.shard_id, e.routing_key) == (1, 6, ALIAS_KEY)
    assert e.failed_at is not None
    assert abs(datetime.now(UTC) - e.failed_at) < timedelta(minutes=1)
    # listing changes nothing, not even the order
    assert await broker.depth(TOPOLOGY.dead_letter_queue) == 5
    assert await event_ids(broker.url) == seeded.order(*"ABCDE")


async def test_a_queue_deeper_than_one_prefetch_window_is_read_by_the_get_pass(
    broker: Broker, seeded: Seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DLQ deeper than AMQP's prefetch limit (65,535) cannot be held by one consumer: the read falls back
    to the basic.get pass on the channel it opened. The window is lowered to 2 to get there with 5 letters."""
    from worker.ops.dlq import reading as readings
    from worker.ops.dlq.sweep import Sweep

    monkeypatch.setattr(readings, "MAX_PREFETCH", 2)
    async with (
        dlq.open_dead_letters(broker.url, TOPOLOGY) as queue,
        await readings.read(queue, EVERY) as reading,
    ):
        assert isinstance(reading, Sweep)
    assert await event_ids(broker.url) == seeded.order(*"ABCDE")
    assert await broker.depth(TOPOLOGY.dead_letter_queue) == 5


async def test_list_filters(broker: Broker, seeded: Seeded) -> None:
    async def ids(**selection: Any) -> list[str | None]:
        return await event_ids(broker.url, dlq.Selection(**selection))

    assert await ids(kinds=frozenset({"schema"})) == seeded.order("B")
    assert await ids(kinds=frozenset({"schema", "delivery_limit"})) == seeded.order("B", "E")
    assert await ids(event_ids=frozenset({seeded.ids["C"]})) == seeded.order("C")
    assert await ids(event_ids=frozenset({seeded.ids["D"]})) == seeded.order("D")  # message_id
    assert await ids(older_than=timedelta(hours=1)) == seeded.order("A", "D")
    assert await ids(older_than=timedelta(days=1)) == seeded.order("D")
    assert await ids(older_than=timedelta(hours=1), kinds=frozenset({"malformed"})) == seeded.order("D")
    assert await ids(kinds=frozenset({"nothing_like_this"})) == []


async def test_list_json_on_the_command_line(broker: Broker, seeded: Seeded) -> None:
    ran = await cli("list", "--json", url=broker.url)

    assert ran.code == 0, ran.err
    lines = [json.loads(line) for line in ran.out.splitlines()]
    assert [line["event_id"] for line in lines] == seeded.order(*"ABCDE")
    assert all(set(line) == JSON_KEYS for line in lines)
    a, e = lines[0], lines[4]
    assert a == {
        "event_id": seeded.ids["A"],
        "kind": "transient_exhausted",
        "error": "database unavailable: connection refused",
        "attempts": 5,
        "failed_at": a["failed_at"],
        "shard_id": 3,
        "routing_key": MAIN_KEY,
    }
    assert datetime.fromisoformat(a["failed_at"].replace("Z", "+00:00")) < datetime.now(UTC)
    assert (e["kind"], e["attempts"], e["routing_key"]) == ("delivery_limit", 1, ALIAS_KEY)

    filtered = await cli("list", "--json", "--kind", "schema,malformed", "--older-than", "1m", url=broker.url)
    assert filtered.code == 0, filtered.err
    assert [json.loads(line)["event_id"] for line in filtered.out.splitlines()] == seeded.order("B", "D")

    human = await cli("list", "--event-id", seeded.ids["A"], url=broker.url)
    assert human.code == 0, human.err
    header, row = human.out.splitlines()
    assert header.split()[:2] == ["EVENT_ID", "KIND"]
    assert row.split()[:6] == [seeded.ids["A"], "transient_exhausted", "5", a["failed_at"], "3", "2h"]
    assert row.endswith("database unavailable: connection refused")

    bad = await cli("list", "--older-than", "soon", url=broker.url)
    assert bad.code == 2
    assert "not a duration" in bad.err


# --- show -------------------------------------------------------------------------------------------------


async def test_show_prints_the_whole_message(broker: Broker, seeded: Seeded) -> None:
    ran = await cli("show", seeded.ids["A"], url=broker.url)

    assert ran.code == 0, ran.err
    assert "transient_exhausted, 5 attempt(s)" in ran.out
    assert "content_type: application/json" in ran.out
    assert f"message_id: {seeded.ids['A']}" in ran.out
    assert "type: tool_call.v1" in ran.out
    assert "x-ltm-error: database unavailable: connection refused" in ran.out
    assert "body (JSON," in ran.out
    assert f'  "event_id": "{seeded.ids["A"]}",' in ran.out  # pretty-printed

    malformed = await cli("show", seeded.ids["D"], url=broker.url)
    assert malformed.code == 0, malformed.err
    assert f"body (not JSON, {len(MALFORMED)} bytes):" in malformed.out
    assert repr(MALFORMED) in malformed.out

    broker_made = await cli("show", seeded.ids["E"], url=broker.url)
    assert broker_made.code == 0, broker_made.err
    assert '"reason": "delivery_limit"' in broker_made.out

    missing = await cli("show", "no-such-event", url=broker.url)
    assert missing.code == 1
    assert missing.err.strip() == "no dead letter with event id no-such-event in ltm.create_memory.dlq"
    assert await event_ids(broker.url) == seeded.order(*"ABCDE")


# --- purge ------------------------------------------------------------------------------------------------


async def test_purge_with_yes_removes_only_the_selected(broker: Broker, seeded: Seeded) -> None:
    ran = await cli("purge", "--yes", "--kind", "schema", "--kind", "delivery_limit", url=broker.url)

    assert ran.code == 0, ran.err
    assert ran.out.strip() == "deleted 2, kept 3"
    assert await event_ids(broker.url) == seeded.order("A", "C", "D")


async def test_purge_without_a_terminal_or_yes_refuses(broker: Broker, seeded: Seeded) -> None:
    ran = await cli("purge", url=broker.url)

    assert ran.code == 2
    assert "--yes" in ran.err
    assert await broker.depth(TOPOLOGY.dead_letter_queue) == 5


async def test_purge_asks_and_deletes_exactly_what_it_counted(broker: Broker, seeded: Seeded) -> None:
    prompts: list[str] = []

    def answering(answer: str) -> Any:
        async def ask(prompt: str) -> str:
            prompts.append(prompt)
            return answer

        return ask

    older = dlq.Selection(older_than=timedelta(hours=1))
    out = io.StringIO()
    console = dlq.Console(out=out, err=io.StringIO())
    code = await dlq.purge_command(
        broker.url, TOPOLOGY, older, yes=False, ask=answering("n"), console=console
    )
    assert code == 1
    assert prompts == ["Delete 2 dead letters? [y/N] "]
    assert await broker.depth(TOPOLOGY.dead_letter_queue) == 5

    code = await dlq.purge_command(
        broker.url, TOPOLOGY, older, yes=False, ask=answering("y"), console=console
    )
    assert code == 0
    assert out.getvalue().splitlines()[-1] == "deleted 2, kept 3"
    assert await event_ids(broker.url) == seeded.order("B", "C", "E")


# --- replay -----------------------------------------------------------------------------------------------


async def test_replay_restores_key_properties_and_body(broker: Broker, seeded: Seeded) -> None:
    before = datetime.now(UTC) - timedelta(seconds=1)
    async with dlq.open_dead_letters(broker.url, TOPOLOGY) as queue:
        totals = await dlq.replay(queue)

    assert (totals.removed, totals.kept, totals.failures) == (5, 0, [])
    assert await broker.depth(TOPOLOGY.dead_letter_queue) == 0
    replayed = {m.message_id: m for m in await broker.take_all(TOPOLOGY.work_queue)}
    assert set(replayed) == set(seeded.ids.values())
    expected_keys = {"A": MAIN_KEY, "B": ALIAS_KEY, "C": ALIAS_KEY, "D": MAIN_KEY, "E": ALIAS_KEY}
    for letter, key in expected_keys.items():
        message = replayed[seeded.ids[letter]]
        assert message.routing_key == key, letter
        assert message.exchange == TOPOLOGY.tool_calls_exchange
        headers = dict(message.headers or {})
        assert not DEAD_LETTER_HEADERS & set(headers), letter
        assert not [h for h in headers if h == "x-death" or h.startswith(("x-first-death", "x-last-death"))]
        assert headers[REPLAY_COUNT] == 1
        replayed_at = datetime.fromisoformat(headers[REPLAYED_AT].replace("Z", "+00:00"))
        assert before <= replayed_at <= datetime.now(UTC)
        if letter in seeded.sent:  # D's body is not an event
            sent = seeded.sent[letter]
            assert message.body == sent.body
            assert headers["traceparent"] == sent.headers["traceparent"]
            for name in ("content_type", "message_id", "correlation_id", "type", "timestamp", "app_id"):
                assert getattr(message, name) == getattr(sent, name), (letter, name)
            assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert replayed[seeded.ids["D"]].body == MALFORMED
    assert replayed[seeded.ids["C"]].headers[ORIGINAL_ROUTING_KEY] == ALIAS_KEY


async def test_replaying_again_counts_replays_and_resets_attempts(broker: Broker, seeded: Seeded) -> None:
    only_a = dlq.Selection(event_ids=frozenset({seeded.ids["A"]}))
    publisher = Publisher.for_topology(broker.channel, broker.declared)
    for replay_count in (1, 2):
        async with dlq.open_dead_letters(broker.url, TOPOLOGY) as queue:
            assert (await dlq.replay(queue, only_a)).removed == 1
        message = await broker.declared.work_queue.get(timeout=5)
        assert message.message_id == seeded.ids["A"]
        assert message.routing_key == MAIN_KEY
        assert message.headers[REPLAY_COUNT] == replay_count
        assert "x-ltm-attempts" not in message.headers
        # it fails again, and the worker dead-letters it as it does every failure
        await publisher.dead_letter(
            message, kind="transient_exhausted", error="still down", attempts=5, sender=NO_SENDER
        )
        await message.ack()

    [again] = await letters(broker.url, only_a)
    assert (again.replay_count, again.error, again.attempts) == (2, "still down", 5)
    assert await event_ids(broker.url) == seeded.order("B", "C", "D", "E", "A")


async def test_dry_run_moves_nothing(broker: Broker, seeded: Seeded) -> None:
    ran = await cli("replay", "--dry-run", "--kind", "schema,internal", url=broker.url)

    assert ran.code == 0, ran.err
    rows = ran.out.splitlines()
    assert [row.split()[0] for row in rows[1:-1]] == seeded.order("B", "C")
    assert rows[-1] == "dry run: would move 2, keep 3; nothing moved"
    assert await broker.depth(TOPOLOGY.work_queue) == 0
    assert await event_ids(broker.url) == seeded.order(*"ABCDE")


async def test_limit_moves_the_first_n_and_keeps_the_order(broker: Broker, seeded: Seeded) -> None:
    ran = await cli("replay", "--limit", "2", "--batch", "1", url=broker.url)

    assert ran.code == 0, ran.err
    assert ran.out.strip() == "moved 2, kept 3"
    assert [m.message_id for m in await broker.take_all(TOPOLOGY.work_queue)] == seeded.order("A", "B")
    assert await event_ids(broker.url) == seeded.order("C", "D", "E")


async def test_an_unroutable_dead_letter_stays(broker: Broker, seeded: Seeded) -> None:
    stray_id = str(uuid.uuid4())
    await dead_letter_copy(
        broker,
        shard_message(b"{}", event_id=stray_id),
        "tool.some_other_tool",
        kind="schema",
        error="unknown tool_name",
        attempts=1,
        failed_at=datetime.now(UTC),
    )
    await broker.wait_depth(TOPOLOGY.dead_letter_queue, 6)

    ran = await cli("replay", url=broker.url)

    assert ran.code == 1
    assert ran.out.strip() == "moved 5, kept 1"
    assert f"not replayed: {stray_id}: routing key 'tool.some_other_tool' is not bound" in ran.err
    assert await event_ids(broker.url) == [stray_id]


@pytest.mark.slow
async def test_a_replay_killed_mid_batch_loses_nothing_and_running_it_again_sends_no_letter_twice(
    broker: Broker, audit_database: str
) -> None:
    total = 3000
    ids = await fill_dlq(broker, total)
    assert await broker.depth(TOPOLOGY.dead_letter_queue) == total

    process = await replay_until(broker, 300)
    moved = await broker.depth(TOPOLOGY.work_queue)
    process.send_signal(signal.SIGKILL)
    assert await process.wait() == -signal.SIGKILL
    assert moved < total, "the replay finished before the kill; the test proves nothing"

    # the broker requeues what the dead process held; wait until every message is somewhere again
    deadline = time.monotonic() + 10
    while await broker.depth(TOPOLOGY.dead_letter_queue) + await broker.depth(TOPOLOGY.work_queue) < total:
        assert time.monotonic() < deadline, "messages held by the killed replay never came back"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    record = await asyncpg.connect(audit_database)
    try:
        killed = await record.fetchval("SELECT operation_id FROM ltm_dlq_operations")
        in_doubt = {
            row["event_id"]
            for row in await record.fetch(
                "SELECT event_id FROM ltm_dlq_operation_letters"
                " WHERE operation_id = $1 AND outcome = 'pending'",
                killed,
            )
        }

        # at once, not after the heartbeat's lease: the killed replay ran on this machine, its process is gone
        second = await cli("replay", "--rate", "0", url=broker.url)

        assert second.code == 0, second.err
        state, detail = await record.fetchrow(
            "SELECT state, detail FROM ltm_dlq_operations WHERE operation_id = $1", killed
        )
    finally:
        await record.close()
    assert state == "interrupted"
    assert detail.startswith("lost: no heartbeat since"), detail
    assert await broker.depth(TOPOLOGY.dead_letter_queue) == 0
    arrived = Counter(m.message_id for m in await broker.take_all(TOPOLOGY.work_queue))
    assert set(arrived) == set(ids)
    # a letter the killed replay had on record as replayed was removed, not sent again; only one it published
    # without seeing the confirm (pending, at most the batch in flight) can arrive twice
    twice = {event_id for event_id, n in arrived.items() if n > 1}
    assert twice <= in_doubt, sorted(twice - in_doubt)[:5]
    assert len(in_doubt) <= 100
    assert max(arrived.values()) <= 2


# --- connection failures ----------------------------------------------------------------------------------


async def test_unreachable_rabbitmq_exits_3_without_the_password() -> None:
    ran = await cli("list", url="amqp://guest:s3cret@127.0.0.1:1/")

    assert ran.code == 3
    assert ran.err.startswith("cannot reach RabbitMQ at amqp://guest:***@127.0.0.1:1/: ")
    assert "s3cret" not in ran.err


async def test_a_vhost_without_the_dlq_exits_4(rabbitmq_url: str) -> None:
    for args in (("list",), ("replay",), ("purge", "--yes"), ("show", "x")):
        ran = await cli(*args, url=rabbitmq_url)

        assert ran.code == 4, (args, ran.err)
        vhost = vhost_of(rabbitmq_url)
        assert f"queue ltm.create_memory.dlq does not exist on vhost '{vhost}'" in ran.err
        assert "has `worker run` ever started here?" in ran.err


# --- nothing selected: an answer, not a failure ------------------------------------------------------------


async def test_nothing_selected_exits_0_and_a_missing_event_id_exits_1(
    broker: Broker, seeded: Seeded
) -> None:
    nothing = ("--kind", "nothing_like_this")
    for args in (("list", *nothing), ("list", "--json", *nothing)):
        ran = await cli(*args, url=broker.url)
        assert (ran.code, ran.out, ran.err) == (0, "", "0 of 5 dead letters in ltm.create_memory.dlq\n"), args
    replayed = await cli("replay", *nothing, url=broker.url)
    assert (replayed.code, replayed.out) == (0, "moved 0, kept 5\n"), replayed.err
    purged = await cli("purge", "--yes", *nothing, url=broker.url)
    assert (purged.code, purged.out) == (0, "deleted 0, kept 5\n"), purged.err
    assert await broker.depth(TOPOLOGY.dead_letter_queue) == 5

    missing = str(uuid.uuid4())
    shown = await cli("show", missing, url=broker.url)
    assert (shown.code, shown.out) == (1, "")
    assert shown.err == f"no dead letter with event id {missing} in ltm.create_memory.dlq\n"


async def test_an_empty_dlq_lists_no_lines(broker: Broker) -> None:
    ran = await cli("list", url=broker.url)

    assert (ran.code, ran.out, ran.err) == (0, "", "0 of 0 dead letters in ltm.create_memory.dlq\n")


# --- what the shard fairness change adds: per-shard keys, the publisher's identity -----------------------


async def test_a_replay_reaches_the_common_key_as_the_operator_with_the_recorded_publisher(
    broker: Broker,
) -> None:
    """A letter of a per-shard key (``tool.<name>.shard.<N>``) replays to ``tool.<name>``, keeps the worker's
    ``x-ltm-user-id`` and is published as the replaying connection's own user (the broker refuses any
    other)."""
    event_id = str(uuid.uuid4())
    message = shard_message(event_body({}, persona_id=7, event_id=event_id, shard_id=3), event_id=event_id)
    message.headers = {**(message.headers or {}), "x-ltm-user-id": "shard-3"}
    await dead_letter_copy(
        broker,
        message,
        f"{MAIN_KEY}.shard.3",
        kind="shard_backlog_full",
        error="shard 3 had 1000 events waiting",
        attempts=1,
        failed_at=datetime.now(UTC),
    )
    await broker.wait_depth(TOPOLOGY.dead_letter_queue, 1)

    shown = await cli("show", event_id, url=broker.url)
    assert shown.code == 0, shown.err
    assert f"replays to: {MAIN_KEY} (replayed 0 time(s) so far)" in shown.out
    assert "published by: shard-3 (recorded by the worker)" in shown.out
    assert "what to do: the shard had more events waiting than its bound" in shown.out

    ran = await cli("replay", url=broker.url)
    assert (ran.code, ran.out) == (0, "moved 1, kept 0\n"), ran.err
    [replayed] = await broker.take_all(TOPOLOGY.work_queue)
    assert replayed.routing_key == MAIN_KEY
    # the user of the URL the replay connected with (guest locally, the container's admin user there)
    assert replayed.user_id == unquote(urlsplit(broker.url).username or "guest")
    assert replayed.headers["x-ltm-user-id"] == "shard-3"


# --- reading is not neutral: said so, and bounded ---------------------------------------------------------


async def test_show_says_reads_are_not_attempts_and_what_to_do(broker: Broker, seeded: Seeded) -> None:
    """Newcomer review F13: every read of the queue raises x-delivery-count; list and show read the kept
    letters instead and leave it as it was; F12: what a replay can do, per kind."""
    for _ in range(2):
        assert (await cli("list", url=broker.url)).code == 0
    kept = await cli("show", seeded.ids["B"], url=broker.url)
    assert kept.code == 0, kept.err
    assert "state: waiting in the DLQ; kept in Postgres since " in kept.out
    assert "x-delivery-count" not in kept.out  # two lists and a show took nothing from the queue
    assert "  redelivered: false" in kept.out

    for _ in range(2):
        assert (await cli("list", "--from-queue", url=broker.url)).code == 0
    shown = await cli("show", seeded.ids["B"], "--from-queue", url=broker.url)

    assert shown.code == 0, shown.err
    assert "schema, 1 attempt(s)" in shown.out  # the processing attempts, from x-ltm-attempts
    assert "read from the DLQ: 2 time(s) before this one (every list, show and page view takes" in shown.out
    assert "  x-delivery-count: 2 (times read from the DLQ)" in shown.out
    assert "  redelivered: true (read from the DLQ before, not a processing attempt)" in shown.out
    assert "what to do: a replay fails again: the event breaks the contract" in shown.out
    a = await cli("show", seeded.ids["A"], url=broker.url)
    assert "what to do: a database or broker fault outlasted every retry: replay once it is fixed" in a.out


async def test_a_replay_says_which_letters_will_fail_again(broker: Broker, seeded: Seeded) -> None:
    dry = await cli("replay", "--dry-run", url=broker.url)
    assert dry.code == 0, dry.err
    assert "note: 2 of them (1 schema, 1 malformed) would fail again and come back to the DLQ" in dry.err
    ran = await cli("replay", "--kind", "transient_exhausted", url=broker.url)
    assert ran.code == 0, ran.err
    assert "note:" not in ran.err  # nothing hopeless was replayed


async def test_a_view_keeps_no_bodies(broker: Broker) -> None:
    """Security review 4, N7: a list held every body of the DLQ (1,000 letters of 255 KB: 304 MB). A read
    keeps a description per letter and drops the body as it arrives: the Python heap's peak over a list of
    60 letters of 200 KB (12 MB of bodies) stays under half of that (it held all 12 MB before; what stays is
    aiormq's buffer of at most ten frames per channel, and the connection's own)."""
    body = json.dumps({"padding": "x" * 200_000}).encode()
    for _ in range(60):
        event_id = str(uuid.uuid4())
        await dead_letter_copy(
            broker,
            shard_message(body, event_id=event_id),
            MAIN_KEY,
            kind="schema",
            error="body over the bound",
            attempts=1,
            failed_at=datetime.now(UTC),
        )
    await broker.wait_depth(TOPOLOGY.dead_letter_queue, 60)

    tracemalloc.start()
    try:
        found = await letters(broker.url)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(found) == 60
    assert peak < 6_000_000, f"a list of 12 MB of dead letters peaked at {peak} bytes"
