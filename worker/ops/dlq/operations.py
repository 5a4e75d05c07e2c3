"""What ``worker dlq`` does to the queue: browse (leave it as it was) and purge, and what every pass shares
(its :class:`Totals`, a stop asked for between batches, the :class:`Journal` it records in); a replay is
:mod:`worker.ops.dlq.replaying`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from worker.broker.dead_letters import letter_key
from worker.ops.dlq.audit import Taken
from worker.ops.dlq.reading import Seen, read
from worker.ops.dlq.selection import Selection
from worker.ops.dlq.sweep import DEFAULT_BATCH, DeadLetterQueue, Found, Pass, Sweep


@dataclass(slots=True)
class Totals:
    """What a pass did."""

    #: messages in the queue when the pass started
    expected: int = 0
    scanned: int = 0
    selected: int = 0
    removed: int = 0
    #: (event id, why) for each selected dead letter that could not be republished
    failures: list[tuple[str | None, str]] = field(default_factory=list)
    #: removed without being sent again: an earlier replay that was stopped at once had sent them
    replayed_before: int = 0
    #: who stopped the replay (``worker dlq cancel``) once what it held was settled; None: it ran to the end
    cancelled_by: str | None = None

    @property
    def kept(self) -> int:
        """Dead letters of the ones present at the start that are still in the queue."""
        return max(self.expected, self.scanned) - self.removed

    @classmethod
    def of(cls, sweep: Pass[Any]) -> Totals:
        return cls(sweep.expected, sweep.scanned, sweep.selected, sweep.removed)


ProgressFn = Callable[[Sweep[Found]], None]

#: asked between batches: True stops a replay or purge there, the way a cancellation would (Ctrl-C was
#: pressed, and the cancellation it sent may have been lost on the way: see :class:`commands.Interruption`)
StopFn = Callable[[], bool]


def stop_here(stop: StopFn | None) -> None:
    """Raise :class:`asyncio.CancelledError` if the caller asked to stop: what the pass holds goes back."""
    if stop is not None and stop():
        raise asyncio.CancelledError("interrupted")


class Journal(Protocol):
    """Where a replay or purge records each dead letter (:class:`worker.ops.dlq.audit.Operation`): ``taking``
    before a letter is republished or deleted, ``settled`` once the broker confirmed what became of it. If
    either raises, the operation stops there and what it still holds goes back to the queue."""

    async def taking(self, letters: Sequence[Taken]) -> None: ...

    async def settled(
        self, letters: Sequence[Taken], outcome: str, details: Mapping[int, str] | None = None
    ) -> None: ...


def taken(found: Sequence[Found]) -> list[Taken]:
    """What the record keeps of each letter: its delivery tag, what it says, and its kept row's key."""
    return [
        Taken(
            item.message.delivery_tag,
            item.letter.event_id,
            item.letter.kind,
            item.letter.replay_count,
            letter_key(item.message.body, dict(item.message.headers or {}), item.message.message_id),
        )
        for item in found
        if item.message.delivery_tag is not None
    ]


async def browse(
    dlq: DeadLetterQueue,
    selection: Selection,
    on_found: Callable[[Seen, datetime], None],
    *,
    batch: int = DEFAULT_BATCH,
    limit: int | None = None,
    details: bool = False,
) -> Totals:
    """Call ``on_found`` for every selected dead letter, with its headers, properties and (the start of) its
    body when ``details`` is set, else with its description alone; the queue is left as it was."""
    async with await read(dlq, selection, batch=batch, limit=limit, details=details) as sweep:
        while (found := await sweep.next_batch()) is not None:
            for item in found:
                on_found(item, sweep.now)
        return Totals.of(sweep)


async def purge(
    dlq: DeadLetterQueue,
    selection: Selection = Selection(),
    *,
    batch: int = DEFAULT_BATCH,
    confirm: Callable[[int], Awaitable[bool]] | None = None,
    progress: ProgressFn | None = None,
    journal: Journal | None = None,
    stop: StopFn | None = None,
    outcome: str = "deleted",
) -> Totals:
    """Delete the selected dead letters (``stop``: asked before each batch is taken and before any goes;
    ``outcome``: what the journal records, ``expired`` for the retention's sweep).

    Without ``confirm`` they are acked batch by batch. With it, the whole queue is scanned first and the
    selected ones stay held (invisible to anyone else) while ``confirm(count)`` decides: exactly the
    dead letters counted are the ones deleted.
    """
    async with await dlq.sweep(selection, batch=batch) as sweep:
        chosen: list[Taken] = []
        while True:
            stop_here(stop)
            found = await sweep.next_batch()
            if found is None:
                break
            stop_here(stop)
            if confirm is None:
                await _delete(sweep, taken(found), journal, outcome)
            else:  # hold the selection by delivery tag (and what the audit records): the bodies can go
                chosen.extend(taken(found))
            if progress is not None:
                progress(sweep)
        if confirm is not None and chosen:
            if await confirm(len(chosen)):
                stop_here(stop)
                await _delete(sweep, chosen, journal, outcome)
            elif journal is not None:  # declined: on record as kept
                await journal.taking(chosen)
                await journal.settled(chosen, "kept")
        return Totals.of(sweep)


async def _delete(
    sweep: Sweep[Found], letters: Sequence[Taken], journal: Journal | None, outcome: str = "deleted"
) -> None:
    """Ack ``letters``: on record as pending first, ``outcome`` (deleted, expired) once acked."""
    if journal is not None:
        await journal.taking(letters)
    await sweep.remove_tags([letter.tag for letter in letters])
    if journal is not None:
        await journal.settled(letters, outcome)
