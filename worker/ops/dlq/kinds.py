"""What each kind of dead letter means to the person on call: can a replay help, and what to do.

The one place ``list``, ``show``, ``replay`` and the page read it. Kinds are matched by their string value
(``x-ltm-error-kind``, or the broker's x-death reason), so a kind this table does not know (a newer worker's)
is shown as it is, with neutral advice, and a replay is offered for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Advice:
    """Whether replaying a dead letter of a kind can succeed, and what to do about the kind."""

    replay_helps: bool
    hint: str


#: what a replay of a letter that cannot succeed does, said first wherever a replay is offered
FAILS_AGAIN = "a replay fails again"

#: the kinds the worker writes in ``x-ltm-error-kind`` (CONTRACT.md section 7), newest last
WORKER_KINDS: dict[str, Advice] = {
    "malformed": Advice(
        False,
        "the shard sent a body that is not a readable event (not UTF-8 JSON, or not an object): "
        "fix the sender (the body shows what it sent), then purge these letters",
    ),
    "schema": Advice(
        False,
        "the event breaks the contract (the error names the field): fix the shard that sent it (shard_id "
        "in the body), then purge these letters",
    ),
    "transient_exhausted": Advice(
        True,
        "a database or broker fault outlasted every retry: replay once it is fixed (`worker check` says "
        "whether the worker can run)",
    ),
    "internal": Advice(
        True,
        "an error the worker did not expect (a bug; the error names it): replay once a fixed worker runs",
    ),
    "event_conflict": Advice(
        False,
        "its event_id was already answered for a different event, and is refused again: find the shard "
        "that reused the id (shard_id in the body)",
    ),
    "unverified_shard": Advice(
        False,
        "the RabbitMQ user that published it may not speak for the body's shard_id, and the worker checks "
        "the identity recorded on the letter again: fix the shard's credentials or its shard_id",
    ),
    "shard_backlog_full": Advice(
        True,
        "the shard had more events waiting than its bound, so this one was not processed: replay once the "
        "shard's backlog has drained",
    ),
}

#: the broker's own reasons (x-death), for a message it dead-lettered itself
BROKER_KINDS: dict[str, Advice] = {
    "delivery_limit": Advice(
        True,
        "the broker gave up after the work queue's delivery limit: a worker stopped or crashed on it again "
        "and again, so read the workers' logs before replaying it to them",
    ),
    "rejected": Advice(True, "a consumer rejected it without requeueing: replay once the cause is fixed"),
    "expired": Advice(True, "its message TTL ran out in the work queue: replay it to have it processed"),
    "maxlen": Advice(True, "the work queue was full: replay it once the queue has room"),
}

_UNKNOWN = Advice(
    True, "a kind this tool does not know: the error says what happened; replay once the cause is fixed"
)


#: a transient fault that was no fault of the worker's: the shard's answer had no queue to go to
NO_ROUTE = Advice(
    True,
    "the shard has no queue bound for its answers (the error names it): a shard declares and binds its "
    "results and notifications queues before it publishes (CONTRACT.md section 2); replay once it does",
)


def advice(kind: str, error: str = "") -> Advice:
    """What to do about dead letters of ``kind`` (neutral advice for a kind not in the tables); ``error``,
    the letter's errors, names a cause a kind alone does not (an answer with no route)."""
    if kind == "transient_exhausted" and "(NO_ROUTE)" in error:
        return NO_ROUTE
    return WORKER_KINDS.get(kind) or BROKER_KINDS.get(kind) or _UNKNOWN


def replay_helps(kind: str) -> bool:
    return advice(kind).replay_helps


def hopeless(kinds: Iterable[str]) -> list[str]:
    """The kinds among ``kinds`` whose letters a replay cannot help, in order, each once."""
    return [kind for kind in dict.fromkeys(kinds) if not replay_helps(kind)]


def replay_note(kind: str, error: str = "") -> str:
    """One line for ``show`` and a letter's page: whether a replay helps, and what to do."""
    found = advice(kind, error)
    return f"{FAILS_AGAIN}: {found.hint}" if not found.replay_helps else found.hint
