"""Fair shares: what a worker does with each delivery it is given, decided in one place and in this order
(docs/fair-shares.md "How a worker shares itself"):

1. **The byte budget.** A delivery that would take the bodies held past ``LTM_HELD_BYTES_MAX`` and one more
   body (:meth:`Hand.fits`) is handed back unread: the broker pushed it before the worker stopped consuming.
2. **Checks first.** The body is read against the contract and its sender judged by the identity rule
   (``LTM_SHARD_IDENTITY``). Its *tenant* is its guild inside its shard (:class:`Guild`) only when it
   passed both; every delivery that failed one is served under one tenant of its own, :data:`UNCHECKED`.
   Nothing per shard (a queue, a row, a counter, a label) is ever made for a claim that failed a check.
3. **Held and counted**: under its tenant in the :class:`~worker.runtime.hand.Hand`, and as received by its
   shard (not the worker's own copies: a retry, a moved event).
4. **Its shard's queue** (deliveries of the common queue only): the first sight of a shard asks for its own
   queue; a guild of a shard that has one, holding at least its share of its shard's share of a worker three
   quarters full, is moved there (its shard's other guilds stay).
5. **Its turn**: otherwise it waits for a processing slot, served in turn at two levels, the shards and each
   shard's guilds (:class:`~worker.runtime.slots.Slots`); a stop hands it back instead.

:meth:`FairShares.admit` does steps 1-4 and returns a :class:`Ticket` whose :class:`Action` the consumer
carries out; :meth:`FairShares.turn` is step 5; :meth:`FairShares.done` gives back what the ticket held. No
AMQP here: the consumer acks, moves and hands back (worker/runtime/consumer.py).

The common queue's window (its prefetch) follows the budget too (:meth:`FairShares.window`): the budget
divided by the largest body seen lately, at most ``LTM_PREFETCH``, so a worker of large bodies is not pushed
many times its budget to hand back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Final, NamedTuple, Protocol

import structlog
from aio_pika.abc import AbstractIncomingMessage

from contracts.models import MAX_BODY_BYTES, ToolCallEvent
from worker.broker.envelope import Unreadable, read_event
from worker.broker.headers import Sender, from_worker, sender_of
from worker.runtime.hand import MARGIN_BYTES, Hand
from worker.runtime.slots import Slots
from worker.service.identity import IdentityRule

if TYPE_CHECKING:
    from worker.config import Settings

#: moves awaiting the broker's confirm at once: a loud shard's excess goes to its queue this many at a time,
#: on a channel of its own, so thousands of copies never queue ahead of another shard's result and notice
MOVES_IN_FLIGHT = 32
#: how long the largest body seen counts for the window (two halves of this, the older one dropped in turn)
LARGEST_BODY_SECONDS = 60.0
#: a shard over its queue's bound keeps one dead letter of its turned-away events per this many seconds; the
#: others are answered ("try again later") and not kept, so one shard's flood never fills the DLQ
TURNED_AWAY_LETTER_SECONDS = 60.0
#: a guild whose events are moved is named in the log at most once in this many seconds
MOVING_LOGGED_SECONDS = 600.0

log = structlog.get_logger("worker")


class Unchecked:
    """The tenant of every delivery that failed the schema or the identity rule: one tenant for all of
    them, served in turn like a shard, with nothing per shard made for it."""

    _instance: Unchecked | None = None

    def __new__(cls) -> Unchecked:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHECKED"


UNCHECKED: Final = Unchecked()


class Guild(NamedTuple):
    """The tenant of an event that passed the checks: its guild (``context.guild_disc_id``; a direct
    message's tenant is its channel, ``dm:<channel_disc_id>``) inside its shard."""

    shard: int
    guild: str


#: whose turn a delivery waits for: a guild of a shard, or :data:`UNCHECKED`
Tenant = Guild | Unchecked


def shard_of(tenant: Hashable) -> Hashable:
    """A tenant's group, the level above it in the turns and the shares: its shard (:data:`UNCHECKED` is a
    group of its own)."""
    return tenant.shard if isinstance(tenant, Guild) else tenant


def guild_of(event: ToolCallEvent) -> Guild:
    return Guild(event.shard_id, event.context.tenant)


class Action(Enum):
    """What the consumer does with a delivery."""

    #: wait for a slot in the tenant's turn (:meth:`FairShares.turn`), then process it
    SERVE = "serve"
    #: copy it to its shard's own queue, then ack it (processed here after all if the copy fails)
    MOVE = "move"
    #: give it back to its queue unread (nack, requeue): it would take the worker past its byte budget
    HAND_BACK = "hand back"


@dataclass(slots=True)
class Ticket:
    """One delivery as admitted: what to do with it, and what it holds until :meth:`FairShares.done`."""

    action: Action
    tenant: Tenant
    size: int
    sender: Sender
    #: the body as read at admission, while it is fresh (dropped once the event waits for its turn, so the
    #: window holds bodies only, not their parsed copies: the handler reads it again then)
    read: ToolCallEvent | Unreadable | None
    #: a shard seen here for the first time, on the common queue: the consumer asks for its own queue
    first_sight: int | None = None
    held: bool = False
    slot: bool = False

    @property
    def shard(self) -> int | None:
        """The shard of a delivery that passed the checks, else None."""
        return self.tenant.shard if isinstance(self.tenant, Guild) else None


class QueueBook(Protocol):
    """The shards' own queues a delivery may be moved to
    (:class:`~worker.runtime.shard_queue_set.ShardQueues`)."""

    def has(self, shard_id: int) -> bool: ...


class ShardMeter(Protocol):
    """Where per-shard counts go (:class:`~worker.observability.metrics.Metrics`)."""

    def shard_received(self, shard_id: int, guild: str | None = None) -> None: ...

    def shard_held(self, key: Hashable, count: int) -> None: ...

    def guild_held(self, shard_id: int, guild: str, count: int) -> None: ...


class FairShares:
    """The worker's share-out of itself, process-wide (it outlives a connection: every held delivery's task
    gives back what its ticket holds in ``finally``)."""

    def __init__(
        self,
        settings: Settings,
        stopping: asyncio.Event,
        meter: ShardMeter,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.identity = IdentityRule.of(settings)
        self.hand = Hand(
            settings.prefetch, settings.held_bytes_max, group_of=shard_of, on_change=meter.shard_held
        )
        self.slots = Slots(settings.concurrency, stopping, group_of=shard_of)
        self.moving = asyncio.Semaphore(MOVES_IN_FLIGHT)
        self._meter = meter
        self._prefetch = settings.prefetch
        self._largest = _LargestBody(clock)
        #: set when a body arrives that the common queue's window (:meth:`in_use`) times it would take past
        #: the budget: the consumer narrows the window at once instead of at its next check
        self.too_wide = asyncio.Event()
        self._widest_body = settings.held_bytes_max
        self._clock = clock
        #: per shard turned away at its bound: when its last dead letter was kept, and how many of its events
        #: were answered without one since
        self._lettered: dict[int, float] = {}
        self._unlettered: dict[int, int] = {}
        #: when each guild's first move was last logged
        self._moving_logged: dict[Guild, float] = {}

    def admit(self, message: AbstractIncomingMessage, *, moves_to: QueueBook | None) -> Ticket:
        """Steps 1-4 of the module docstring for one delivery. ``moves_to``: the shards' queues a delivery
        of the common queue may be moved to; None for a delivery from a shard's own queue (never moved
        again)."""
        size = len(message.body)
        self._largest.saw(size)
        if size > self._widest_body:
            self.too_wide.set()
        sender = sender_of(message, self.identity.trusted)
        if not self.hand.fits(size):
            return Ticket(Action.HAND_BACK, UNCHECKED, size, sender, None)
        read = read_event(message.body, message.message_id)
        tenant = self._tenant_of(read, sender)
        ticket = Ticket(Action.SERVE, tenant, size, sender, read, held=True)
        self.hand.add(tenant, size)
        if not isinstance(tenant, Guild):
            return ticket
        shard = tenant.shard
        self._meter.guild_held(shard, tenant.guild, self.hand.held(tenant))
        if not from_worker(message):
            self._meter.shard_received(shard, tenant.guild)
        if moves_to is not None:
            if not moves_to.has(shard):
                ticket.first_sight = shard
            elif self.hand.moves(tenant):
                ticket.action = Action.MOVE
                self._moving(tenant)
        return ticket

    async def turn(self, ticket: Ticket) -> bool:
        """Step 5: a slot in the ticket's tenant's turn; False when the worker starts stopping first (hand
        the delivery back). A ticket that has to wait lets go of its parsed body."""
        if self.slots.try_take(ticket.tenant):
            ticket.slot = True
            return True
        ticket.read = None
        ticket.slot = await self.slots.take(ticket.tenant)
        return ticket.slot

    def done(self, ticket: Ticket) -> None:
        """The delivery is settled (or left to the broker): its slot and its place in the hand go back."""
        if ticket.slot:
            ticket.slot = False
            self.slots.release(ticket.tenant)
        if ticket.held:
            ticket.held = False
            self.hand.remove(ticket.tenant, ticket.size)
            if isinstance(ticket.tenant, Guild):
                self._meter.guild_held(
                    ticket.tenant.shard, ticket.tenant.guild, self.hand.held(ticket.tenant)
                )

    def in_use(self, window: int) -> None:
        """The common queue's window now: a body larger than the budget divided by it makes it too wide."""
        self.too_wide.clear()
        self._widest_body = (self.hand.max_bytes + MARGIN_BYTES) // max(1, window)

    def letter_for_turned_away(self, shard_id: int) -> int | None:
        """An event of shard ``shard_id`` is turned away (its queue is at its bound): the count of its events
        turned away without a dead letter since its last one when this one keeps a letter (the first of
        every :data:`TURNED_AWAY_LETTER_SECONDS`), else None (answered, not kept)."""
        now = self._clock()
        last = self._lettered.get(shard_id)
        if last is not None and now - last < TURNED_AWAY_LETTER_SECONDS:
            self._unlettered[shard_id] = self._unlettered.get(shard_id, 0) + 1
            return None
        for shard, when in list(self._lettered.items()):  # shards quiet for a while: forgotten
            if now - when >= TURNED_AWAY_LETTER_SECONDS and not self._unlettered.get(shard):
                del self._lettered[shard]
        self._lettered[shard_id] = now
        return self._unlettered.pop(shard_id, 0)

    def _moving(self, guild: Guild) -> None:
        """The first move of a guild's events (in :data:`MOVING_LOGGED_SECONDS`) is logged, naming it: who is
        loud inside a shard, without a metric label per guild."""
        now = self._clock()
        last = self._moving_logged.get(guild)
        if last is not None and now - last < MOVING_LOGGED_SECONDS:
            return
        if len(self._moving_logged) >= 1024:  # a flood over many guilds: the oldest are forgotten
            for old in sorted(self._moving_logged, key=self._moving_logged.__getitem__)[:512]:
                del self._moving_logged[old]
        self._moving_logged[guild] = now
        log.info(
            "moving a guild's events to its shard's queue: it holds more than its share",
            shard_id=guild.shard,
            guild=guild.guild,
            held=self.hand.held(guild),
            shard_held=self.hand.held_by_group(guild.shard),
        )

    def window(self) -> int:
        """The common queue's prefetch for what the worker has seen lately: the byte budget divided by the
        largest body of the last minute (the contract's limit before the first), within 1..``LTM_PREFETCH``:
        with bodies of a few KB, ``LTM_PREFETCH``; with bodies of 256 KiB, 512 for the default 128 MiB."""
        return max(1, min(self._prefetch, self.hand.max_bytes // max(1, self._largest.value())))

    def _tenant_of(self, read: ToolCallEvent | Unreadable, sender: Sender) -> Tenant:
        if isinstance(read, Unreadable):
            return UNCHECKED
        refused = self.identity.check(sender.user, read.shard_id, trusted_sender=sender.trusted)
        return UNCHECKED if refused is not None else guild_of(read)


class _LargestBody:
    """The largest body seen in the last :data:`LARGEST_BODY_SECONDS` (two halves, the older dropped in
    turn); the last one known when nothing came since, the contract's limit before anything came."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._half = LARGEST_BODY_SECONDS / 2
        self._since = clock()
        self._current = 0
        self._previous = 0
        self._known = MAX_BODY_BYTES

    def saw(self, size: int) -> None:
        self._roll()
        if size > self._current:
            self._current = size

    def value(self) -> int:
        self._roll()
        largest = max(self._current, self._previous)
        if largest:
            self._known = largest
        return self._known

    def _roll(self) -> None:
        now = self._clock()
        if now - self._since < self._half:
            return
        self._previous = self._current if now - self._since < 2 * self._half else 0
        self._current = 0
        self._since = now
