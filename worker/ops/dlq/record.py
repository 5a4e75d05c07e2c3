"""The audit tables' names (migrations 0007, 0008, 0011) and the SQL that reads their letters: which
were replayed, which came back to the DLQ, which are there twice, which operations still run."""

from __future__ import annotations

from collections.abc import Collection

OPERATIONS = "public.ltm_dlq_operations"
LETTERS = "public.ltm_dlq_operation_letters"
#: a 'started' operation whose heartbeat is older than this stopped without closing its record (killed, or cut
#: off from Postgres); a running one stops itself when it could not write one for half as long
LEASE_SECONDS = 15.0


def alive(column: str) -> str:
    """SQL: the heartbeat ``column`` is recent enough that its operation still runs."""
    return f"{column} > now() - make_interval(secs => {LEASE_SECONDS})"


def pairs(in_dlq: Collection[tuple[str, int]]) -> tuple[list[str], list[int]]:
    return [event_id for event_id, _ in in_dlq], [count for _, count in in_dlq]


def replayed(row: str) -> str:
    """SQL: the letter ``row`` was replayed, and can be recognised if it comes back."""
    return f"{row}.outcome = 'replayed' AND {row}.event_id IS NOT NULL AND {row}.replay_count IS NOT NULL"


def taken_again(row: str) -> str:
    """SQL: a later operation took the replayed copy of ``row`` from the DLQ (same event id, one more
    replay)."""
    return (
        f"EXISTS (SELECT 1 FROM {LETTERS} later WHERE later.event_id = {row}.event_id"
        f" AND later.replay_count = {row}.replay_count + 1)"
    )


def among(events: str, counts: str, event: str, count: str) -> str:
    """SQL: (``event``, ``count``) is among the pairs ``events`` and ``counts`` give side by side."""
    return (
        f"EXISTS (SELECT 1 FROM unnest({events}::text[], {counts}::int[]) AS d(e, c)"
        f" WHERE d.e = {event} AND d.c = {count})"
    )


def twice(row: str, events: str, counts: str) -> str:
    """SQL: the letter ``row`` sent (or maybe sent: pending) is in the DLQ beside its copy."""
    return (
        f"({row}.outcome IN ('replayed', 'pending') AND {row}.event_id IS NOT NULL"
        f" AND {row}.replay_count IS NOT NULL"
        f" AND {among(events, counts, f'{row}.event_id', f'{row}.replay_count')}"
        f" AND {among(events, counts, f'{row}.event_id', f'{row}.replay_count + 1')})"
    )


def came_back(row: str, events: str, counts: str) -> str:
    """SQL: the replayed letter ``row`` came back: taken again, or in the DLQ now (the parameters ``events``
    and ``counts``: the event ids and replay counts found there, side by side)."""
    return (
        f"({replayed(row)} AND ({taken_again(row)}"
        f" OR {among(events, counts, f'{row}.event_id', f'{row}.replay_count + 1')}))"
    )
