"""The failure result a shard got with a dead letter, rebuilt from the letter's kind and its body's ids.

The broker keeps no copy of the result the worker published to ``tomori.tool_results``; the worker builds it
from the kind and the event's ids alone (:func:`~worker.service.policy.route_failure`, the dead-letter
paths), so the same functions rebuild it here, answering the same event, timed at the letter's failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from contracts.models import MAX_BODY_BYTES, DeadLetterKind
from worker.broker.dead_letters import Letter
from worker.broker.envelope import routable_ids
from worker.pipeline import outcome


@dataclass(frozen=True, slots=True)
class Answer:
    """The result (JSON-ready) the shard got, or None, and a sentence saying how it is known."""

    result: dict[str, Any] | None
    note: str


_COMMITTED_CAVEAT = (
    " (unless the event's outcome had committed before the fault: then the stored result was the answer)"
)


def shard_answer(letter: Letter, body: bytes) -> Answer:
    """What the worker sent to the shard with this dead letter, as far as the kind and body say."""
    try:
        kind = DeadLetterKind(letter.kind)
    except ValueError:
        return Answer(None, f"none: the broker dead-lettered it ({letter.kind}); the worker sent no result")
    if len(body) > MAX_BODY_BYTES:
        return Answer(None, "none: a body over 256 KiB is dead-lettered unread, without a result")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    ids = routable_ids(data) if isinstance(data, dict) else None
    if ids is None:
        return Answer(
            None,
            "none: the body's event_id, tool_call_id and shard_id cannot all be read, so no shard is named",
        )
    caveat = ""
    if kind is DeadLetterKind.EVENT_CONFLICT:
        failure = outcome.event_conflict()
    elif kind is DeadLetterKind.TRANSIENT_EXHAUSTED:
        failure, caveat = outcome.database_error(), _COMMITTED_CAVEAT
    elif kind in outcome.DEAD_LETTER_REASONS:
        failure = outcome.internal_error(kind)
        caveat = _COMMITTED_CAVEAT if kind is DeadLetterKind.INTERNAL else ""
    else:
        return Answer(None, f"none: a {kind} dead letter gets no result")
    at = letter.failed_at or datetime.now(UTC)
    result = failure.result(ids, at).model_dump(mode="json")
    return Answer(
        result,
        f"sent to shard.{ids.shard_id} on tomori.tool_results{caveat}; rebuilt here from the kind and the "
        "body's ids, processed_at set to the failure time (the broker keeps no copy)",
    )
