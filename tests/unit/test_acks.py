"""Acks of one channel leave together, and never settle a delivery that is not done or settle one twice:
checked against a model of the broker's bookkeeping (what a real channel would close on): tests/fakes.py's
FakeChannel."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

import pytest

from tests.fakes import FakeChannel
from worker.broker.acks import Acks, AlreadySettled


@dataclass(frozen=True)
class D:
    """A delivery as Acks reads it: its tag on the channel."""

    delivery_tag: int | None


async def test_acks_of_one_turn_leave_as_one_frame() -> None:
    broker = FakeChannel()
    acks = Acks(broker)
    tags = broker.deliver(8)
    await asyncio.gather(*(acks.ack(D(tag)) for tag in reversed(tags)))
    assert broker.frames == [("ack", 8, True)]
    assert broker.settled == dict.fromkeys(tags, "ack")
    assert (acks.ack_frames, acks.acked) == (1, 8)


async def test_a_delivery_in_flight_is_never_covered() -> None:
    broker = FakeChannel()
    acks = Acks(broker)
    broker.deliver(5)
    await asyncio.gather(
        acks.ack(D(1)), acks.ack(D(2)), acks.ack(D(4)), acks.ack(D(5))
    )  # 3 is still in flight
    assert broker.frames == [("ack", 2, True), ("ack", 4, False), ("ack", 5, False)]
    assert 3 in broker.outstanding
    assert not acks.settled(D(3))
    await acks.ack(D(3))
    assert broker.frames[-1] == ("ack", 3, True)  # covers only 3: 4 and 5 are settled already
    assert not broker.outstanding


async def test_a_nack_leaves_at_once_and_the_next_multiple_ack_passes_over_it() -> None:
    broker = FakeChannel()
    acks = Acks(broker)
    broker.deliver(3)
    await acks.nack(D(2), requeue=True)
    assert broker.frames == [("nack", 2, False)]
    await asyncio.gather(acks.ack(D(1)), acks.ack(D(3)))
    assert broker.frames[1:] == [("ack", 3, True)]
    assert broker.settled == {1: "ack", 2: "nack", 3: "ack"}


async def test_settling_twice_is_refused() -> None:
    broker = FakeChannel()
    acks = Acks(broker)
    broker.deliver(2)
    await acks.ack(D(1))
    with pytest.raises(AlreadySettled):
        await acks.ack(D(1))
    await acks.nack(D(2))
    with pytest.raises(AlreadySettled):
        await acks.nack(D(2))
    assert len(broker.frames) == 2


async def test_an_ack_on_a_closed_channel_raises_for_every_waiter() -> None:
    broker = FakeChannel(is_closed=True)
    acks = Acks(broker)
    broker.deliver(2)
    results = await asyncio.gather(acks.ack(D(1)), acks.ack(D(2)), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)


@pytest.mark.parametrize("seed", range(20))
async def test_random_settling_in_random_turns_settles_each_delivery_once_as_asked(seed: int) -> None:
    """Deliveries finish in any order over many turns of the loop, some handed back: the broker sees every
    tag settled exactly once, the way it was asked, and never a frame for an unknown tag."""
    rng = random.Random(seed)
    broker = FakeChannel()
    acks = Acks(broker)
    asked: dict[int, str] = {}
    waiting: list[int] = []
    for _ in range(30):
        waiting += broker.deliver(rng.randint(0, 6))
        rng.shuffle(waiting)
        cut = rng.randint(0, len(waiting))
        now, waiting = waiting[:cut], waiting[cut:]
        turn = []
        for tag in now:
            asked[tag] = "nack" if rng.random() < 0.1 else "ack"
            turn.append(acks.nack(D(tag)) if asked[tag] == "nack" else acks.ack(D(tag)))
        await asyncio.gather(*turn)
    for tag in waiting:
        asked[tag] = "ack"
        await acks.ack(D(tag))
    assert broker.settled == asked
    assert not broker.outstanding
    assert acks.acked == sum(1 for kind in asked.values() if kind == "ack")
    assert acks.ack_frames < acks.acked  # some frames covered several deliveries


async def test_a_delivery_without_a_tag_is_refused_before_any_frame() -> None:
    broker = FakeChannel()
    acks = Acks(broker)
    broker.deliver(1)
    with pytest.raises(ValueError, match="without a tag"):
        await acks.ack(D(None))
    with pytest.raises(ValueError, match="without a tag"):
        await acks.nack(D(None))
    assert broker.frames == []
