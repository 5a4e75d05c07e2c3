"""Acks of one channel leave together, and never settle a delivery that is not done or settle one twice:
checked against a model of the broker's bookkeeping (what a real channel would close on)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

import pytest

from worker.broker.acks import Acks, AlreadySettled


@dataclass
class Broker:
    """The broker's side of one channel: outstanding deliveries and how each was settled. A frame for a tag
    that is not outstanding is what closes a real channel (PRECONDITION_FAILED, unknown delivery tag)."""

    outstanding: set[int] = field(default_factory=set)
    settled: dict[int, str] = field(default_factory=dict)
    frames: list[tuple[str, int, bool]] = field(default_factory=list)

    def deliver(self, count: int) -> list[int]:
        first = len(self.outstanding) + len(self.settled) + 1
        tags = list(range(first, first + count))
        self.outstanding.update(tags)
        return tags

    async def basic_ack(self, delivery_tag: int, multiple: bool = False, wait: bool = True) -> None:
        self._settle("ack", delivery_tag, multiple)

    async def basic_nack(
        self, delivery_tag: int, multiple: bool = False, requeue: bool = True, wait: bool = True
    ) -> None:
        self._settle("nack", delivery_tag, multiple)

    def _settle(self, kind: str, tag: int, multiple: bool) -> None:
        self.frames.append((kind, tag, multiple))
        assert tag in self.outstanding, f"{kind} of unknown delivery tag {tag}"
        for covered in sorted(self.outstanding):
            if covered == tag or (multiple and covered < tag):
                self.outstanding.discard(covered)
                self.settled[covered] = kind


async def test_acks_of_one_turn_leave_as_one_frame() -> None:
    broker = Broker()
    acks = Acks(broker)
    tags = broker.deliver(8)
    await asyncio.gather(*(acks.ack(tag) for tag in reversed(tags)))
    assert broker.frames == [("ack", 8, True)]
    assert broker.settled == dict.fromkeys(tags, "ack")
    assert (acks.ack_frames, acks.acked) == (1, 8)


async def test_a_delivery_in_flight_is_never_covered() -> None:
    broker = Broker()
    acks = Acks(broker)
    broker.deliver(5)
    await asyncio.gather(acks.ack(1), acks.ack(2), acks.ack(4), acks.ack(5))  # 3 is still in flight
    assert broker.frames == [("ack", 2, True), ("ack", 4, False), ("ack", 5, False)]
    assert 3 in broker.outstanding
    assert not acks.settled(3)
    await acks.ack(3)
    assert broker.frames[-1] == ("ack", 3, True)  # covers only 3: 4 and 5 are settled already
    assert not broker.outstanding


async def test_a_nack_leaves_at_once_and_the_next_multiple_ack_passes_over_it() -> None:
    broker = Broker()
    acks = Acks(broker)
    broker.deliver(3)
    await acks.nack(2, requeue=True)
    assert broker.frames == [("nack", 2, False)]
    await asyncio.gather(acks.ack(1), acks.ack(3))
    assert broker.frames[1:] == [("ack", 3, True)]
    assert broker.settled == {1: "ack", 2: "nack", 3: "ack"}


async def test_settling_twice_is_refused() -> None:
    broker = Broker()
    acks = Acks(broker)
    broker.deliver(2)
    await acks.ack(1)
    with pytest.raises(AlreadySettled):
        await acks.ack(1)
    await acks.nack(2)
    with pytest.raises(AlreadySettled):
        await acks.nack(2)
    assert len(broker.frames) == 2


async def test_an_ack_on_a_closed_channel_raises_for_every_waiter() -> None:
    class Closed(Broker):
        async def basic_ack(self, delivery_tag: int, multiple: bool = False, wait: bool = True) -> None:
            raise ConnectionError("channel closed")

    broker = Closed()
    acks = Acks(broker)
    broker.deliver(2)
    results = await asyncio.gather(acks.ack(1), acks.ack(2), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)


@pytest.mark.parametrize("seed", range(20))
async def test_random_settling_in_random_turns_settles_each_delivery_once_as_asked(seed: int) -> None:
    """Deliveries finish in any order over many turns of the loop, some handed back: the broker sees every
    tag settled exactly once, the way it was asked, and never a frame for an unknown tag."""
    rng = random.Random(seed)
    broker = Broker()
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
            turn.append(acks.nack(tag) if asked[tag] == "nack" else acks.ack(tag))
        await asyncio.gather(*turn)
    for tag in waiting:
        asked[tag] = "ack"
        await acks.ack(tag)
    assert broker.settled == asked
    assert not broker.outstanding
    assert acks.acked == sum(1 for kind in asked.values() if kind == "ack")
    assert acks.ack_frames < acks.acked  # some frames covered several deliveries
