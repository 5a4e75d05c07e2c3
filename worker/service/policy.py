"""How a delivery ends, decided over values: the retry-or-dead-letter policy, and the processing slots.

:func:`route_failure` (a failed attempt), :func:`route_unreadable` (a body that is no event) and
:func:`route_conflict` (an event id the ledger holds for another event) are the whole policy: they alone
pick where a failed delivery goes and what its shard is told; the handler only carries out what they
return (docs/operating.md "How an event can end"). :meth:`RetryPolicy.tiers` is the one place that says
which retry queues exist. No I/O here.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from contracts.models import DeadLetterKind
from worker.faults import is_transient
from worker.pipeline import outcome

if TYPE_CHECKING:
    from worker.config import Settings

#: the error a conflicting event's dead letter carries (``x-ltm-error``)
CONFLICT_ERROR = "event_id conflict: the ledger holds this event_id for a different event"


class Unreadable(Protocol):
    """What the policy reads of a body that is no event (:class:`worker.broker.envelope.Unreadable`):
    its kind, and the envelope's ids when they could be read."""

    @property
    def kind(self) -> DeadLetterKind: ...

    @property
    def ids(self) -> object | None: ...


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how late a transient fault is tried again (``LTM_RETRY_*``)."""

    max_attempts: int = 5
    base_delay_ms: int = 1000
    max_delay_ms: int = 60000
    #: draws the jitter factor between the two bounds (seedable in tests)
    draw: Callable[[float, float], float] = field(default=random.uniform, compare=False)

    @classmethod
    def of(cls, settings: Settings) -> RetryPolicy:
        """The policy the ``LTM_RETRY_*`` settings give."""
        return cls(settings.retry_max_attempts, settings.retry_base_delay_ms, settings.retry_max_delay_ms)

    def tier_before(self, attempt: int) -> int:
        """The retry queue's nominal delay (ms) before ``attempt`` (2 = the first retry): doubling from
        ``base_delay_ms``, capped at ``max_delay_ms``."""
        return min(self.base_delay_ms << max(0, attempt - 2), self.max_delay_ms)

    def tiers(self) -> list[int]:
        """Every tier a retry can use (attempts 2 to ``max_attempts``), ascending: one retry queue each,
        declared at start-up and sampled for ``/metrics``."""
        return sorted({self.tier_before(attempt) for attempt in range(2, self.max_attempts + 1)})

    def delay_before(self, attempt: int) -> int:
        """The tier's delay with jitter (75-100 %), so a burst of failures does not come back as one."""
        return max(1, int(self.tier_before(attempt) * self.draw(0.75, 1.0)))


@dataclass(frozen=True, slots=True)
class Retry:
    """Park the delivery in the retry queue of ``tier_ms`` for ``delay_ms``, counting ``attempts`` made."""

    tier_ms: int
    delay_ms: int
    attempts: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Copy the delivery to the DLQ as ``kind``; answer the shard with ``failure`` when there is one."""

    kind: DeadLetterKind
    attempts: int
    failure: outcome.Outcome | None


def route_failure(
    exc: BaseException, attempt: int, *, committed: bool, policy: RetryPolicy
) -> Retry | DeadLetter:
    """Where attempt number ``attempt`` of an event goes after ``exc``.

    A bug is dead-lettered at once as ``internal``; a transient fault is retried until ``max_attempts``,
    then dead-lettered as ``transient_exhausted``. A failure result goes with the dead letter only when
    the event's outcome did not commit (``committed``): otherwise the stored answer stands, and a replay
    re-emits it.
    """
    if not is_transient(exc):
        failure = None if committed else outcome.internal_error(DeadLetterKind.INTERNAL)
        return DeadLetter(DeadLetterKind.INTERNAL, attempt, failure)
    if attempt >= policy.max_attempts:
        return DeadLetter(
            DeadLetterKind.TRANSIENT_EXHAUSTED, attempt, None if committed else outcome.database_error()
        )
    return Retry(policy.tier_before(attempt + 1), policy.delay_before(attempt + 1), attempt)


def route_unreadable(parsed: Unreadable) -> DeadLetter:
    """A body that is no event is dead-lettered at once as its kind (``malformed``, ``schema``), on its
    first attempt; its shard is answered with an internal error when the envelope's ids could be read."""
    return DeadLetter(parsed.kind, 1, outcome.internal_error(parsed.kind) if parsed.ids else None)


def route_conflict(attempt: int) -> DeadLetter:
    """An event whose id the ledger holds for a different event is dead-lettered as ``event_conflict`` and
    answered with the refusal: never the stored outcome, never a notice or an invalidation."""
    return DeadLetter(DeadLetterKind.EVENT_CONFLICT, attempt, outcome.event_conflict())


def route_unverified(attempt: int) -> DeadLetter:
    """An event whose sender may not speak for its shard (:mod:`worker.service.identity`) is dead-lettered
    as ``unverified_shard``, answered with an internal error (to the sender's own shard: the handler's)."""
    return DeadLetter(
        DeadLetterKind.UNVERIFIED_SHARD, attempt, outcome.internal_error(DeadLetterKind.UNVERIFIED_SHARD)
    )


def route_backlog_full(attempt: int, *, answered: bool) -> DeadLetter:
    """An event its shard's own queue has no room for is dead-lettered as ``shard_backlog_full`` and
    answered (when its ids can be read) with an internal error that says to try again later; a replay
    processes it once the shard's backlog has drained."""
    kind = DeadLetterKind.SHARD_BACKLOG_FULL
    return DeadLetter(kind, attempt, outcome.internal_error(kind) if answered else None)
