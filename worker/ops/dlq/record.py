"""The audit tables' names (migrations 0007, 0008, 0011, 0012) and the SQL that reads their letters: which
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


#: the kept letters (migration 0012): an operation's outcome for a letter is its row's new state
KEPT = "public.ltm_dead_letters"
#: outcome -> the state it gives the letter's kept row (an outcome not here leaves the row as it is: the
#: letter is still in the DLQ)
STATE_OF = {"replayed": "replayed", "replayed_before": "replayed", "deleted": "purged", "expired": "expired"}


def state_detail(outcome: str, actor: str, rate: float | None) -> str:
    """The line a kept letter's state says of an operation's ``outcome`` (``rate``: a replay's)."""
    if outcome == "replayed":
        pace = "as fast as the broker confirms" if rate is None else f"at {rate:g}/s"
        return f"replayed by {actor} {pace}"
    if outcome == "replayed_before":
        return f"sent by an earlier replay that was stopped at once; its original removed by {actor}"
    if outcome == "expired":
        return f"expired by {actor}: older than the retention (LTM_DLQ_RETENTION)"
    return f"purged by {actor}"


def settle_sql() -> str:
    """SQL: settle an operation's letters (``$1`` the operation, ``$2`` the outcome, ``$3``/``$4`` the
    positions and details side by side) and, in the same statement, set the state of their kept rows (``$5``
    the state, NULL: none; ``$6`` its line). A replayed letter whose copy is already kept (the same event id,
    one replay more: it came back before the settle) is ``came_back``; a letter with no row (the keeper is
    behind, or it was dead-lettered before the table existed) has nothing to update: ``worker dlq check``
    finds it."""
    return f"""
        WITH settled AS (
            UPDATE {LETTERS} l SET outcome = $2, detail = d.detail, recorded_at = now()
            FROM unnest($3::int[], $4::text[]) AS d(position, detail)
            WHERE l.operation_id = $1 AND l.position = d.position
            RETURNING l.letter_key
        ), target AS (
            SELECT k.letter_key, $5 = 'replayed' AND EXISTS (
                SELECT 1 FROM {KEPT} c WHERE c.event_id = k.event_id AND c.replay_count = k.replay_count + 1
            ) AS back
            FROM {KEPT} k JOIN settled s USING (letter_key)
            WHERE $5::text IS NOT NULL
        )
        UPDATE {KEPT} k
        SET state = CASE WHEN t.back THEN 'came_back' ELSE $5 END, state_at = now(), operation_id = $1,
            state_detail = CASE WHEN t.back THEN $6 || '; its replay had already failed again' ELSE $6 END
        FROM target t
        WHERE k.letter_key = t.letter_key
    """
