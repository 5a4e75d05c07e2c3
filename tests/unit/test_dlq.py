"""The pure parts of ``worker dlq``: durations, reading dead-letter headers, replay headers, output."""

from __future__ import annotations

import asyncio
import os
import signal
from datetime import UTC, datetime, timedelta

import pytest

from worker.broker.dead_letters import describe_dead_letter
from worker.broker.publisher import no_route
from worker.broker.urls import vhost_of
from worker.config import Topology
from worker.ops import dlq
from worker.ops.dlq.cli import Interruption
from worker.ops.dlq.kinds import replay_note
from worker.ops.dlq.operations import StopFn
from worker.ops.dlq.render import json_depth, terminal_safe
from worker.ops.dlq.replaying import Senders, user_of
from worker.redact import redact_url

TOPOLOGY = Topology()
NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
BODY = b'{"event_id": "e-1", "shard_id": 3, "arguments": {}}'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("10m", timedelta(minutes=10)),
        ("2h", timedelta(hours=2)),
        ("1d", timedelta(days=1)),
        ("1w", timedelta(weeks=1)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        (" 2H ", timedelta(hours=2)),
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    assert dlq.parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "10", "h", "1.5h", "-1h", "1h 30m", "2 days"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        dlq.parse_duration(text)


def test_a_worker_dead_letter_is_read_from_its_headers() -> None:
    letter = dlq.describe_dead_letter(
        BODY,
        {
            "x-ltm-error": "boom",
            "x-ltm-error-kind": "internal",
            "x-ltm-attempts": 2,
            "x-ltm-failed-at": "2026-12-02T08:00:00.120Z",
            "x-ltm-routing-key": "tool.remember_this_fact",
            "x-ltm-replay-count": 1,
            "x-death": [{"queue": "ltm.create_memory.retry.1000", "reason": "expired", "count": 1}],
        },
        message_id="e-1",
        routing_key="tool.remember_this_fact",
        topology=TOPOLOGY,
    )
    assert letter.as_json() == {
        "event_id": "e-1",
        "kind": "internal",
        "error": "boom",
        "attempts": 2,
        "failed_at": "2026-12-02T08:00:00.120Z",
        "shard_id": 3,
        "routing_key": "tool.remember_this_fact",
    }
    assert letter.replay_count == 1
    assert letter.age(NOW) == timedelta(hours=1, minutes=59, seconds=59, milliseconds=880)


def test_a_broker_dead_letter_is_read_from_x_death() -> None:
    died = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
    letter = dlq.describe_dead_letter(
        b"\xff not json",
        {
            "x-death": [
                {
                    "count": 1,
                    "reason": "delivery_limit",
                    "queue": "ltm.create_memory",
                    "time": died,
                    "exchange": "tomori.tool_calls",
                    "routing-keys": ["tool.create_long_term_memory"],
                },
                {"count": 1, "reason": "expired", "queue": "ltm.create_memory.retry.1000", "time": died},
            ],
            "x-first-death-reason": "expired",
            "x-delivery-count": 7,  # redeliveries from the DLQ itself: not attempts
        },
        message_id="from-message-id",
        routing_key="ltm.create_memory",
        topology=TOPOLOGY,
    )
    assert letter.as_json() == {
        "event_id": "from-message-id",
        "kind": "delivery_limit",
        "error": "redelivered more than the delivery limit",
        "attempts": 1,
        "failed_at": "2026-12-02T09:00:00.000Z",
        "shard_id": None,
        "routing_key": "tool.create_long_term_memory",
    }


@pytest.mark.parametrize(
    ("exchange", "letter_key", "routes_to"),
    [
        ("tomori.tool_calls", "tool.create_long_term_memory", "tool.create_long_term_memory"),
        ("", "ltm.create_memory", "tool.kept"),
        # an x-death the shard wrote itself, naming the default exchange: its routing key gives it away
        ("", "tool.create_long_term_memory", "tool.create_long_term_memory"),
    ],
)
def test_a_broker_dead_letter_keeps_x_ltm_routing_key_only_from_the_workers_retry_copy(
    exchange: str, letter_key: str, routes_to: str
) -> None:
    """A shard that sets x-ltm-routing-key on an event that reaches the delivery limit does not steer its
    replay; the worker's own retry copy (through the default exchange, back into the work queue by its
    name) does."""
    death = {
        "count": 1,
        "reason": "delivery_limit",
        "queue": "ltm.create_memory",
        "exchange": exchange,
        "routing-keys": [letter_key],
    }
    headers = {"x-death": [death], "x-ltm-routing-key": "tool.kept"}
    letter = dlq.describe_dead_letter(
        b"{}", headers, message_id=None, routing_key=letter_key, topology=TOPOLOGY
    )
    assert letter.routing_key == routes_to


def test_a_message_without_dead_letter_headers() -> None:
    letter = dlq.describe_dead_letter(b"[1]", {}, message_id=None, routing_key="tool.x", topology=TOPOLOGY)
    assert (letter.event_id, letter.kind, letter.attempts, letter.failed_at) == (None, "unknown", None, None)
    assert letter.routing_key == "tool.x"


def test_selection() -> None:
    old = dlq.Letter("e-1", "schema", "x", 1, NOW - timedelta(hours=3), 3, "k", message_id="m-1")
    unknown_time = dlq.Letter("e-2", "schema", "x", 1, None, 3, "k")
    assert dlq.Selection().matches(old, NOW)
    assert dlq.Selection(kinds=frozenset({"schema", "internal"})).matches(old, NOW)
    assert not dlq.Selection(kinds=frozenset({"internal"})).matches(old, NOW)
    assert dlq.Selection(event_ids=frozenset({"e-1"})).matches(old, NOW)
    # the message_id property is the publisher's to set: the body's event id is what --event-id means
    assert not dlq.Selection(event_ids=frozenset({"m-1"})).matches(old, NOW)
    assert dlq.Selection(older_than=timedelta(hours=2)).matches(old, NOW)
    assert not dlq.Selection(older_than=timedelta(hours=4)).matches(old, NOW)
    assert not dlq.Selection(older_than=timedelta(seconds=1)).matches(unknown_time, NOW)


def test_replay_headers_drop_failure_and_broker_bookkeeping() -> None:
    headers = dlq.replay_headers(
        {
            "traceparent": "00-abc-def-01",
            "x-ltm-routing-key": "tool.remember_this_fact",
            "x-ltm-error": "boom",
            "x-ltm-error-kind": "internal",
            "x-ltm-failed-at": "2026-12-02T08:00:00.000Z",
            "x-ltm-attempts": 5,
            "x-ltm-replay-count": 2,
            "x-death": [],
            "x-first-death-reason": "expired",
            "x-first-death-queue": "q",
            "x-last-death-reason": "expired",
            "x-delivery-count": 3,
            "x-ltm-user-id": "shard-3",
        },
        NOW,
        "shard-4",
    )
    assert headers == {
        "traceparent": "00-abc-def-01",
        "x-ltm-routing-key": "tool.remember_this_fact",
        "x-ltm-replayed-at": "2026-12-02T10:00:00.000Z",
        "x-ltm-replay-count": 3,
        # the sender published_by found travels with the replay (the worker checks it), never the letter's
        # own header, which is the worker's record only where published_by says so
        "x-ltm-user-id": "shard-4",
    }


@pytest.mark.parametrize(
    ("key", "replayed_to"),
    [
        ("tool.create_long_term_memory.shard.3", "tool.create_long_term_memory"),
        ("tool.remember_this_fact.shard.12", "tool.remember_this_fact"),
        ("tool.create_long_term_memory", "tool.create_long_term_memory"),
        ("tool.x.shard.", "tool.x.shard."),  # not a shard number
        ("other.thing.shard.3", "other.thing.shard.3"),  # not a tool key
    ],
)
def test_a_per_shard_routing_key_replays_to_the_common_key(key: str, replayed_to: str) -> None:
    letter = dlq.describe_dead_letter(
        b"{}", {"x-ltm-error-kind": "shard_backlog_full"}, message_id=None, routing_key=key, topology=TOPOLOGY
    )
    assert (letter.routing_key, letter.replay_key) == (key, replayed_to)


# --- who published a dead letter (security review 5, N-C) ------------------------------------------------
# The x-death entries are as RabbitMQ 3.10 wrote them for each path (a probe on a vhost of its own: a shard's
# event over the work queue's delivery limit, one with a forged x-death, the worker's retry copy, its move
# into a shard's queue, a shard's own-key event over its queue's limit).

WORK, SHARD_QUEUE, RETRY = "ltm.create_memory", "ltm.create_memory.shard.1", "ltm.create_memory.retry.1000"
COMMON, OWN_KEY = "tool.create_long_term_memory", "tool.create_long_term_memory.shard.1"


def death(queue: str, exchange: str, key: str, reason: str = "delivery_limit") -> dict[str, object]:
    return {"count": 1, "reason": reason, "queue": queue, "exchange": exchange, "routing-keys": [key]}


#: a shard's event the broker dead-lettered from the work queue (no worker ran): its own header is forged
SHARDS_EVENT = {"x-ltm-user-id": "shard-1", "x-death": [death(WORK, "tomori.tool_calls", COMMON)]}


@pytest.mark.parametrize(
    ("headers", "user_id", "routing_key", "user", "source", "said"),
    [
        # the worker made the letter: its record counts, "" being its record of no user_id
        (
            {"x-ltm-error-kind": "unverified_shard", "x-ltm-user-id": b"shard-4"},
            None,
            COMMON,
            "shard-4",
            "worker",
            "shard-4 (recorded by the worker)",
        ),
        (
            {
                "x-ltm-error-kind": "internal",
                "x-ltm-user-id": "",
                "x-death": [death(RETRY, "", RETRY, "expired")],
            },
            None,
            COMMON,
            None,
            "worker",
            "none (no user_id, recorded by the worker)",
        ),
        # the broker dead-lettered the worker's own copy: a retry back in the work queue, a move
        (
            {
                "x-ltm-user-id": "shard-1",
                "x-death": [death(WORK, "", WORK), death(RETRY, "", RETRY, "expired")],
            },
            None,
            WORK,
            "shard-1",
            "worker",
            "shard-1 (recorded by the worker)",
        ),
        (
            {"x-ltm-user-id": "shard-1", "x-death": [death(SHARD_QUEUE, "", SHARD_QUEUE)]},
            None,
            SHARD_QUEUE,
            "shard-1",
            "worker",
            "shard-1 (recorded by the worker)",
        ),
        # the review's two events: the broker dead-lettered them as shard-0 published them
        (
            SHARDS_EVENT,
            "shard-0",
            COMMON,
            "shard-0",
            "user_id",
            "shard-0 (the message's user_id, checked by RabbitMQ; its x-ltm-user-id 'shard-1' is not known "
            "to be the worker's, ignored)",
        ),
        (
            {"x-death": [death(WORK, "tomori.tool_calls", COMMON)]},
            None,
            COMMON,
            None,
            "unknown",
            "unknown (no user_id)",
        ),
        (
            SHARDS_EVENT,
            None,
            COMMON,
            None,
            "unknown",
            "unknown (no user_id; its x-ltm-user-id 'shard-1' is not known to be the worker's, ignored)",
        ),
        # a forged x-death naming the default exchange (RabbitMQ keeps it): the routing key gives it away
        (
            {"x-ltm-user-id": "shard-1", "x-death": [death(WORK, "", WORK)]},
            None,
            COMMON,
            None,
            "unknown",
            None,
        ),
        # a forged x-ltm-error-kind does not make the broker's letter the worker's
        ({**SHARDS_EVENT, "x-ltm-error-kind": "internal"}, None, COMMON, None, "unknown", None),
        # a shard's own-key event over its queue's limit
        (
            {"x-ltm-user-id": "shard-2", "x-death": [death(SHARD_QUEUE, "tomori.tool_calls", OWN_KEY)]},
            "shard-1",
            OWN_KEY,
            "shard-1",
            "user_id",
            None,
        ),
    ],
)
def test_a_letters_sender_is_the_workers_record_else_the_user_id_rabbitmq_checked(
    headers: dict[str, object],
    user_id: str | None,
    routing_key: str,
    user: str | None,
    source: str,
    said: str | None,
) -> None:
    found = dlq.published_by(headers, user_id=user_id, routing_key=routing_key, topology=TOPOLOGY)
    letter = dlq.describe_dead_letter(
        b"{}", headers, message_id=None, routing_key=routing_key, topology=TOPOLOGY, user_id=user_id
    )

    assert (found.user, found.source) == (user, source)
    assert letter.published_by == found
    if said is not None:
        assert found.describe() == said
    if "x-death" in headers and source != "worker":
        assert letter.kind == "delivery_limit"  # the broker's reason, whatever x-ltm-error-kind says


def test_a_trusted_publishers_record_counts_on_its_own_message_the_broker_dead_lettered() -> None:
    """A replay (the operator's user_id, the sender it recorded) the broker dead-lettered again stays that
    sender's, not the operator's own event, when LTM_TRUSTED_PUBLISHERS names the operator."""
    replayed = {"x-ltm-user-id": "shard-0", "x-death": [death(WORK, "tomori.tool_calls", COMMON)]}

    def sender(headers: dict[str, object], trusted: frozenset[str]) -> dlq.PublishedBy:
        return dlq.published_by(
            headers, user_id="operator", routing_key=COMMON, topology=TOPOLOGY, trusted=trusted
        )

    ops = frozenset({"operator"})
    assert (sender(replayed, ops).user, sender(replayed, ops).source) == ("shard-0", "trusted_publisher")
    assert sender(replayed, frozenset()).user == "operator"  # not trusted: its user_id is all that counts
    none = {**replayed, "x-ltm-user-id": ""}
    assert sender(none, ops).user is None
    own = {"x-death": replayed["x-death"]}
    assert (sender(own, ops).user, sender(own, ops).source) == ("operator", "trusted_publisher")


def test_a_replay_of_a_letter_with_no_known_sender_is_refused_under_required_unless_vouched_for() -> None:
    unknown = dlq.describe_dead_letter(
        b"{}", SHARDS_EVENT, message_id=None, routing_key=COMMON, topology=TOPOLOGY
    )
    known = dlq.describe_dead_letter(
        b"{}", SHARDS_EVENT, message_id=None, routing_key=COMMON, topology=TOPOLOGY, user_id="shard-0"
    )
    required, vouched = Senders(refuse_unknown=True), Senders(refuse_unknown=True, as_trusted_publisher=True)

    why = required.refusal(unknown)
    assert why is not None
    assert why.startswith("no known sender (unknown (no user_id; ")
    assert "--as-trusted-publisher" in why
    assert required.refusal(known) is None
    assert required.sender(known, "operator") == "shard-0"
    assert vouched.refusal(unknown) is None
    assert vouched.sender(unknown, "operator") == "operator"
    assert vouched.sender(known, "operator") == "shard-0"  # a known sender stays the sender
    # checked and shared: replayed with no sender (""), as the event had none
    assert Senders().refusal(unknown) is None
    assert Senders().sender(unknown, "operator") == ""


@pytest.mark.parametrize(
    ("url", "user"),
    [
        ("amqp://operator:pw@rmq:5672/ltm", "operator"),
        ("amqp://ops%40team:pw@rmq/", "ops@team"),
        ("amqp://rmq:5672/", "guest"),  # aio-pika's default login
        ("amqps://:pw@rmq/", "guest"),
    ],
)
def test_a_replay_publishes_as_the_user_it_connected_as(url: str, user: str) -> None:
    assert user_of(url) == user


@pytest.mark.parametrize(
    ("age", "text"),
    [
        (None, "-"),
        (timedelta(seconds=45), "45s"),
        (timedelta(minutes=12, seconds=5), "12m"),
        (timedelta(hours=2), "2h"),
        (timedelta(hours=3, minutes=12), "3h12m"),
        (timedelta(days=2, hours=4, minutes=1), "2d4h"),
        (timedelta(seconds=-5), "0s"),
    ],
)
def test_ages(age: timedelta | None, text: str) -> None:
    assert dlq.format_age(age) == text


def test_urls_in_messages_carry_no_password() -> None:
    assert redact_url("amqp://guest:s3cret@host:5672/v") == "amqp://guest:***@host:5672/v"
    assert redact_url("amqp://host/") == "amqp://host/"
    assert vhost_of("amqp://guest:guest@host:5672/") == "/"
    assert vhost_of("amqp://guest:guest@host:5672/%2Fprod") == "/prod"
    assert vhost_of("amqp://host") == "/"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain id-1 ü ☃", "plain id-1 ü ☃"),
        ("a\x1b[2Jb", "a\\x1b[2Jb"),
        ("line\r\nfake", "line\\r\\nfake"),
        ("tab\there\x07\x00\x7f", "tab\\there\\x07\\x00\\x7f"),
        ("csi\x9b31m", "csi\\x9b31m"),
        ("rtl\u202eoverride\u2066\u200b", "rtl\\u202eoverride\\u2066\\u200b"),
    ],
)
def test_terminal_safe_escapes_what_a_terminal_acts_on(text: str, shown: str) -> None:
    assert terminal_safe(text) == shown


@pytest.mark.parametrize(
    ("body", "depth"),
    [
        (b'{"a": 1}', 1),
        (b'{"a": [[{"b": []}]]}', 5),
        (b'{"a": "[[[[\\"{{"}', 1),  # brackets inside a string, an escaped quote
        (b"[" * 10_000 + b"]" * 10_000, 10_000),
        (b"not json", 0),
    ],
)
def test_json_depth_counts_nesting_outside_strings(body: bytes, depth: int) -> None:
    assert json_depth(body) == depth


async def test_a_ctrl_c_is_not_lost_when_what_the_command_awaits_swallows_its_cancellation() -> None:
    # aiormq runs each RPC in a task of its own, and Python 3.11's wait_for in it may return normally when
    # cancelled: asyncio.run's cancellation of the command was lost there and the replay ran to the end
    # a run started as a background job of a script has SIGINT ignored (and the command rightly leaves it
    # so): this test wants Python's own handler, as a terminal gives it
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    interruption = Interruption()
    seen: list[object] = []

    async def swallows() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "swallowed"
        return "slept"

    async def command(stop: StopFn) -> int:
        seen.append(stop())
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, taken while the next await is pending
        seen.append(await asyncio.get_running_loop().create_task(swallows()))
        seen.append(stop())  # what replay and purge ask between batches
        return 0

    try:
        assert await interruption.run(command) == dlq.EXIT_INTERRUPTED
        assert seen == [False, "swallowed", True]  # the cancellation was lost; the interruption was not
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handed back
    finally:
        signal.signal(signal.SIGINT, inherited)


async def test_a_command_that_ends_before_ctrl_c_keeps_its_exit_code() -> None:
    async def command(stop: StopFn) -> int:
        return 1 if not stop() else 99

    assert await Interruption().run(command) == 1


def test_a_letter_keeps_its_first_attempts_error_and_an_answer_with_no_route_is_named() -> None:
    """Newcomer review 5, N2: the last attempt failed on a Postgres that was down, the first ones on a result
    with no route; the letter shows both, and what to do names the shard's missing queue."""
    unroutable = no_route("tomori.tool_results", "shard.4")
    assert unroutable.startswith("shard 4 has no queue bound for its results, tomori.shard.4.results")
    assert no_route("tomori.tool_results", "elsewhere") == (
        "nothing is bound to 'tomori.tool_results' with key 'elsewhere' (NO_ROUTE)"
    )
    headers = {
        "x-ltm-error": "ConnectionRefusedError: [Errno 111] Connection refused",
        "x-ltm-error-kind": "transient_exhausted",
        "x-ltm-attempts": 5,
        "x-ltm-failed-at": "2026-12-02T08:00:00.000Z",
        "x-ltm-first-error": f"TransientError: {unroutable}",
    }
    letter = describe_dead_letter(b"{}", headers, message_id=None, routing_key="", topology=Topology())
    assert letter.first_error == f"TransientError: {unroutable}"
    assert replay_note(letter.kind, letter.errors).startswith("the shard has no queue bound for its answers")
    assert replay_note(letter.kind, letter.error).startswith("a database or broker fault")
