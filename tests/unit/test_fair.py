"""The fair-share decision (worker/runtime/fair.py) with fake deliveries, no broker: checks first (nothing per
shard for a claim that failed the schema or the identity rule), the move, the byte budget, the turn, and the
window the budget allows."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Hashable
from typing import Any, cast

import orjson
import pytest
from aio_pika.abc import AbstractIncomingMessage

from contracts.models import MAX_BODY_BYTES, ToolCallEvent
from tests.factories import GUILD, event_body
from tests.fakes import FakeMessage
from worker.config import Settings
from worker.runtime.fair import UNCHECKED, Action, FairShares, Guild
from worker.runtime.hand import MARGIN_BYTES

ARGS = {"memory_content": "Kaede likes dogs", "memory_scope": "server_wide"}


class Meter:
    """What fair shares count per shard."""

    def __init__(self) -> None:
        self.received: Counter[int] = Counter()
        self.held: dict[Hashable, int] = {}
        self.guilds: dict[tuple[int, str], int] = {}

    def shard_received(self, shard_id: int, guild: str | None = None) -> None:
        self.received[shard_id] += 1

    def guild_held(self, shard_id: int, guild: str, count: int) -> None:
        self.guilds[(shard_id, guild)] = count

    def shard_held(self, key: Hashable, count: int) -> None:
        self.held[key] = count


class Queues:
    def __init__(self, *shards: int) -> None:
        self.shards = set(shards)

    def has(self, shard_id: int) -> bool:
        return shard_id in self.shards


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def body(shard_id: int, guild: str | None = GUILD, **extra: Any) -> bytes:
    data = event_body(ARGS, persona_id=7, shard_id=shard_id, guild=guild)
    raw = data if isinstance(data, bytes) else orjson.dumps(data)
    if extra:
        raw = orjson.dumps({**orjson.loads(raw), **extra})
    return raw


def delivery(raw: bytes, *, user_id: str | None = None, exchange: str = "tomori.tool_calls") -> Any:
    return cast(AbstractIncomingMessage, FakeMessage(raw, user_id=user_id, exchange=exchange))


def shares(identity: str = "checked", **settings: Any) -> tuple[FairShares, Meter, asyncio.Event, Clock]:
    meter, stopping, clock = Meter(), asyncio.Event(), Clock()
    fair = FairShares(Settings(shard_identity=identity, **settings), stopping, meter, clock=clock)
    return fair, meter, stopping, clock


# -- checks first: nothing per shard for a claim that failed a check -----------------------------------------


@pytest.mark.parametrize(
    ("raw", "user_id", "identity"),
    [
        (b'{"shard_id": 700}', "shard-0", "required"),  # N-A's one-line body: fails the schema
        (b'{"shard_id": 700}', None, "checked"),
        (b"not json", None, "checked"),
        (body(700), None, "required"),  # a valid event without user_id under required
        (body(700), "shard-0", "checked"),  # one shard's user speaking for another
        (body(700), "shard-0", "required"),
    ],
    ids=["junk-required", "junk-checked", "not-json", "no-user-required", "another", "another-required"],
)
def test_a_claim_that_fails_a_check_gets_no_queue_no_count_and_no_move(
    raw: bytes, user_id: str | None, identity: str
) -> None:
    fair, meter, _, _ = shares(identity, prefetch=4)
    tickets = [fair.admit(delivery(raw, user_id=user_id), moves_to=Queues(700)) for _ in range(4)]
    assert {t.tenant for t in tickets} == {UNCHECKED}
    assert {t.action for t in tickets} == {Action.SERVE}, "a full window moves nothing that failed a check"
    assert all(t.first_sight is None and t.shard is None for t in tickets)
    assert not meter.received
    assert set(meter.held) == {UNCHECKED}, "held under the one tenant of the unchecked, not by shard"
    assert fair.hand.held(UNCHECKED) == 4


@pytest.mark.parametrize(
    ("user_id", "identity"),
    [
        ("shard-3", "required"),
        ("shard-3", "checked"),
        (None, "checked"),
        ("guest", "checked"),
        (None, "shared"),
    ],
)
def test_an_event_that_passed_both_checks_is_its_shards_and_asks_for_its_queue(
    user_id: str | None, identity: str
) -> None:
    fair, meter, _, _ = shares(identity)
    ticket = fair.admit(delivery(body(3), user_id=user_id), moves_to=Queues())
    assert (ticket.tenant, ticket.action, ticket.first_sight) == (Guild(3, GUILD), Action.SERVE, 3)
    assert meter.received == Counter({3: 1})
    assert isinstance(ticket.read, ToolCallEvent), "the event, read once, travels on"


def test_a_trusted_publishers_replay_is_its_recorded_senders() -> None:
    fair, _, _, _ = shares("required")
    replay = FakeMessage(body(3), user_id="operator", headers={"x-ltm-user-id": "shard-4"})
    assert fair.admit(cast(AbstractIncomingMessage, replay), moves_to=Queues()).tenant is UNCHECKED
    replay = FakeMessage(body(3), user_id="operator", headers={"x-ltm-user-id": "shard-3"})
    assert fair.admit(cast(AbstractIncomingMessage, replay), moves_to=Queues()).shard == 3


def test_the_workers_own_copy_is_not_counted_again_and_a_shard_queues_delivery_is_never_moved() -> None:
    fair, meter, _, _ = shares(prefetch=4)
    copy = delivery(body(3), exchange="")  # a retry or a moved event, its sender recorded on it
    ticket = fair.admit(copy, moves_to=None)
    assert ticket.shard == 3
    assert not meter.received
    for _ in range(5):  # the window past three quarters, shard 3 alone in it
        assert fair.admit(delivery(body(3), exchange=""), moves_to=None).action is Action.SERVE


# -- the move ------------------------------------------------------------------------------------------------


def test_below_three_quarters_nothing_moves_then_the_shard_holding_its_share_does() -> None:
    fair, _, _, _ = shares(prefetch=8)
    queues = Queues(1, 2)
    actions = [fair.admit(delivery(body(1)), moves_to=queues).action for _ in range(5)]
    assert actions == [Action.SERVE] * 5, "5 of 8 held: under three quarters"
    assert fair.admit(delivery(body(1)), moves_to=queues).action is Action.MOVE, "6 of 8, shard 1 alone"
    assert fair.admit(delivery(body(2)), moves_to=queues).action is Action.SERVE, "shard 2 holds 1 of 7"


def test_a_shard_without_a_queue_is_never_moved_first_sight_asks_for_one() -> None:
    fair, _, _, _ = shares(prefetch=4)
    tickets = [fair.admit(delivery(body(5)), moves_to=Queues()) for _ in range(6)]
    assert {t.action for t in tickets} == {Action.SERVE}
    assert {t.first_sight for t in tickets} == {5}


# -- the byte budget -----------------------------------------------------------------------------------------


def test_past_the_budget_and_one_body_a_delivery_is_handed_back_unread_and_not_held() -> None:
    budget = 4 * MAX_BODY_BYTES
    fair, meter, _, _ = shares(held_bytes_max=budget)
    big = body(1, padding="x" * (MAX_BODY_BYTES - 2000))
    held = []
    while True:
        ticket = fair.admit(delivery(big), moves_to=Queues(1))
        if ticket.action is Action.HAND_BACK:
            break
        held.append(ticket)
    assert fair.hand.bytes <= budget + MARGIN_BYTES
    assert fair.hand.full.is_set()
    assert not fair.hand.room.is_set()
    assert not ticket.held, "handed back, not held"
    assert ticket.read is None, "handed back unread"
    assert meter.received[1] == len(held)
    for ticket in held[: len(held) - 1]:
        fair.done(ticket)
    assert fair.hand.room.is_set(), "half the budget processed: the queues may be consumed again"


def test_an_empty_hand_takes_even_a_body_over_the_contracts_limit() -> None:
    fair, _, _, _ = shares(held_bytes_max=1024)
    ticket = fair.admit(delivery(b"x" * (MAX_BODY_BYTES + MARGIN_BYTES + 1)), moves_to=None)
    assert ticket.action is Action.SERVE
    assert ticket.tenant is UNCHECKED


def test_the_window_follows_the_largest_body_of_the_last_minute() -> None:
    fair, _, _, clock = shares(prefetch=8192, held_bytes_max=128 * 1024 * 1024)
    assert fair.window() == 512, "before any body: as if each were the contract's largest"
    fair.done(fair.admit(delivery(body(1)), moves_to=None))
    assert fair.window() == 8192, "bodies of a few hundred bytes: the whole window"
    fair.done(fair.admit(delivery(body(1, padding="x" * 200_000)), moves_to=None))
    assert fair.window() == 128 * 1024 * 1024 // len(body(1, padding="x" * 200_000))
    clock.now += 31
    fair.done(fair.admit(delivery(body(1)), moves_to=None))
    assert fair.window() < 8192, "the large body still counts within the minute"
    clock.now += 31
    fair.done(fair.admit(delivery(body(1)), moves_to=None))
    assert fair.window() == 8192, "a minute later only the small ones count"
    clock.now += 600
    assert fair.window() == 8192, "idle: the last size known stays"


# -- the turn ------------------------------------------------------------------------------------------------


async def test_a_turn_is_a_slot_and_done_gives_back_the_slot_and_the_hand() -> None:
    fair, meter, _, _ = shares(concurrency=2)
    first = fair.admit(delivery(body(1)), moves_to=None)
    assert await fair.turn(first)
    assert first.read is not None, "a free slot: the event read at admission goes on"
    second = fair.admit(delivery(body(1)), moves_to=None)
    waiting = asyncio.ensure_future(fair.turn(second))  # the last slot is kept for another shard
    await asyncio.sleep(0)
    assert not waiting.done()
    assert second.read is None, "a waiting event lets go of its parsed body"
    fair.done(first)
    assert await waiting
    fair.done(second)
    assert fair.hand.total == 0
    assert meter.held[1] == 0
    assert not fair.slots.all_taken


async def test_a_stop_loses_the_turn_and_keeps_nothing() -> None:
    fair, _, stopping, _ = shares(concurrency=1)
    busy = fair.admit(delivery(body(1)), moves_to=None)
    assert await fair.turn(busy)
    other = fair.admit(delivery(body(2)), moves_to=None)
    waiting = asyncio.ensure_future(fair.turn(other))
    await asyncio.sleep(0)
    stopping.set()
    assert await waiting is False
    fair.done(other)
    fair.done(busy)
    assert fair.hand.total == 0
    assert fair.slots.waiting == 0


def test_a_shard_over_its_bound_keeps_one_letter_a_minute_with_the_count_of_the_others() -> None:
    fair, _, _, clock = shares()
    assert fair.letter_for_turned_away(0) == 0, "the first of the minute keeps its letter"
    assert [fair.letter_for_turned_away(0) for _ in range(5)] == [None] * 5
    assert fair.letter_for_turned_away(1) == 0, "every shard has its own minute"
    clock.now += 60
    assert fair.letter_for_turned_away(0) == 5, "the next letter counts the five answered without one"
    assert fair.letter_for_turned_away(0) is None


# -- guilds: the tenants inside a shard ----------------------------------------------------------------------


def test_a_guild_is_the_tenant_inside_its_shard_and_a_direct_message_is_its_channels() -> None:
    fair, meter, _, _ = shares()
    assert fair.admit(delivery(body(3, guild="1150000000000000777")), moves_to=None).tenant == Guild(
        3, "1150000000000000777"
    )
    direct = fair.admit(delivery(body(3, guild=None)), moves_to=None)
    assert direct.tenant == Guild(3, "dm:1150000000000000100")
    assert direct.shard == 3
    assert meter.held == {3: 2}, "held counted by shard, never by guild"


def test_the_loud_guild_of_a_loud_shard_is_moved_and_its_quiet_guilds_stay() -> None:
    fair, _, _, _ = shares(prefetch=8)
    queues = Queues(1)
    loud, quiet = "1150000000000000771", "1150000000000000772"
    assert fair.admit(delivery(body(1, guild=quiet)), moves_to=queues).action is Action.SERVE
    actions = [fair.admit(delivery(body(1, guild=loud)), moves_to=queues).action for _ in range(5)]
    assert actions == [Action.SERVE] * 4 + [Action.MOVE], "6 of 8 held: shard 1 alone, 5 of them the loud's"
    assert fair.admit(delivery(body(1, guild=quiet)), moves_to=queues).action is Action.SERVE, (
        "the quiet guild holds 2 of its shard's 8: under its share, it stays"
    )


async def test_inside_a_shard_the_guilds_are_served_in_turn() -> None:
    """One event per guild per turn: a quiet guild's event, queued behind ten of a loud guild's of the same
    shard, starts after at most one of them."""
    fair, _, _, _ = shares(concurrency=3)
    loud, quiet = "1150000000000000771", "1150000000000000772"
    busy = [fair.admit(delivery(body(1, guild=loud)), moves_to=None) for _ in range(2)]
    for ticket in busy:
        assert await fair.turn(ticket)
    other = fair.admit(delivery(body(2)), moves_to=None)
    assert await fair.turn(other)  # all three slots taken
    order: list[str] = []

    async def wait(guild: str) -> None:
        ticket = fair.admit(delivery(body(1, guild=guild)), moves_to=None)
        assert await fair.turn(ticket)
        order.append(guild)

    waiters = [asyncio.create_task(wait(loud)) for _ in range(10)]
    await asyncio.sleep(0.01)
    waiters.append(asyncio.create_task(wait(quiet)))
    await asyncio.sleep(0.01)
    for ticket in (*busy, other):
        fair.done(ticket)
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)
    assert order[:2] == [loud, quiet], "the quiet guild waited behind more than one of the loud guild's"
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)


def test_a_body_the_window_would_take_past_the_budget_asks_for_a_narrower_window_at_once() -> None:
    fair, _, _, _ = shares(prefetch=8192, held_bytes_max=128 * 1024 * 1024)
    fair.in_use(8192)
    fair.done(fair.admit(delivery(body(1)), moves_to=None))
    assert not fair.too_wide.is_set(), "8,192 bodies of this size fit the budget"
    fair.done(fair.admit(delivery(body(1, padding="x" * 200_000)), moves_to=None))
    assert fair.too_wide.is_set(), "8,192 bodies of 200 KB would not"
    fair.in_use(fair.window())
    assert not fair.too_wide.is_set()
    fair.done(fair.admit(delivery(body(1, padding="x" * 200_000)), moves_to=None))
    assert not fair.too_wide.is_set(), "the narrowed window fits them"
