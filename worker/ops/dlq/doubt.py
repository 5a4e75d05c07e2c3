"""What a replay that was stopped at once left in doubt, and how the next replay of the DLQ finishes it
without sending a letter twice.

A replay republishes a batch, waits for the broker's confirms, records the letters ``replayed`` and only then
removes the originals from the DLQ. A process killed in between (``kill -9``, a second Ctrl-C, a lost
machine) leaves originals in the DLQ whose copies were sent: on record as ``replayed`` (confirmed, the
removal lost) or ``pending`` (published, the confirm not yet seen). Before the next replay sends a letter, it
asks the record (:func:`sent_before`):

- an earlier replay recorded it ``replayed`` (or ``replayed_before``): its copy went; the original is removed,
  on record as ``replayed_before``, not sent again;
- an earlier replay left it ``pending``: its copy went if the worker has answered the event since that replay
  started (``ltm_processed_events``), or if the copy (the same event id, one replay more) is in the DLQ now
  (read once, before the pass, only when such letters exist: :func:`pending_elsewhere`); removed so too;
- otherwise it is sent: a copy that was published but is still waiting in the work queue is then there twice,
  and the worker answers the second from its record of the first (no second memory; the shard may see the
  answer twice).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, Protocol

from worker.ops.dlq.record import LETTERS, OPERATIONS, alive

#: runs a statement of the audit record and returns its rows (:meth:`worker.ops.dlq.audit.Audit.query`)
Query = Callable[..., Awaitable[list[Any]]]

PROCESSED = "public.ltm_processed_events"


class Letter(Protocol):
    @property
    def tag(self) -> int: ...

    @property
    def event_id(self) -> str | None: ...

    @property
    def replay_count(self) -> int: ...


async def pending_elsewhere(query: Query, operation_id: uuid.UUID) -> bool:
    """Whether an earlier replay that no longer runs left letters ``pending`` (then the DLQ is read once
    before the pass, for their copies)."""
    rows = await query(
        f"SELECT EXISTS (SELECT 1 FROM {LETTERS} r JOIN {OPERATIONS} o USING (operation_id)"
        " WHERE r.outcome = 'pending' AND r.operation_id <> $1 AND o.action = 'replay'"
        f" AND (o.state <> 'started' OR NOT {alive('o.heartbeat_at')})) AS found",
        operation_id,
    )
    return bool(rows and rows[0]["found"])


async def sent_before(
    query: Query,
    operation_id: uuid.UUID,
    letters: Sequence[Letter],
    in_dlq: Collection[tuple[str, int]] = (),
) -> dict[int, str]:
    """The letters among ``letters`` an earlier replay already sent, by delivery tag, each with how that is
    known; ``in_dlq``: the (event id, replay count) of the letters in the DLQ before the pass. Each letter is
    looked up by its event id (a lateral subquery the planner may not flatten: ``OFFSET 0``), so a round costs
    the same whatever the record holds, with or without the planner's statistics (a join planned without
    them scanned every letter on record: 18 ms a round over 9,000 letters, 0.5 ms this way)."""
    known = [letter for letter in letters if letter.event_id is not None]
    if not known:
        return {}
    rows = await query(
        f"""
        SELECT t.tag, r.outcome, r.operation_id, o.started_at, o.actor,
               EXISTS (SELECT 1 FROM {PROCESSED} p WHERE p.event_id = t.u AND p.processed_at >= o.started_at)
                   AS answered
        FROM unnest($2::bigint[], $3::text[], $4::int[], $5::uuid[]) AS t(tag, e, c, u)
        CROSS JOIN LATERAL (
            SELECT l.outcome, l.operation_id FROM {LETTERS} l
            WHERE l.event_id = t.e AND l.replay_count = t.c AND l.operation_id <> $1
              AND l.outcome IN ('replayed', 'replayed_before', 'pending')
            OFFSET 0
        ) r
        JOIN {OPERATIONS} o ON o.operation_id = r.operation_id
        WHERE o.action = 'replay'
        ORDER BY o.started_at
        """,
        operation_id,
        [letter.tag for letter in known],
        [letter.event_id for letter in known],
        [letter.replay_count for letter in known],
        [_uuid(letter.event_id) for letter in known],
    )
    counts = {letter.tag: (letter.event_id, letter.replay_count) for letter in known}
    sent: dict[int, str] = {}
    for row in rows:
        tag = row["tag"]
        if tag in sent:
            continue
        event_id, count = counts[tag]
        by = f"replay {row['operation_id']} by {row['actor']}"
        if row["outcome"] in ("replayed", "replayed_before"):
            sent[tag] = f"{by} sent it (confirmed) and stopped before removing it"
        elif row["answered"]:
            sent[tag] = f"{by} sent it and stopped before the confirm; the worker has answered it since"
        elif (event_id, count + 1) in in_dlq:
            sent[tag] = f"{by} sent it and stopped before the confirm; its copy came back to the DLQ"
    return sent


def _uuid(text: str | None) -> uuid.UUID | None:
    """The event id as the worker keys its record (a UUID), or None: such a letter was never answered."""
    try:
        return uuid.UUID(text or "")
    except ValueError:
        return None
