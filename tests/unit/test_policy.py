"""The retry-or-dead-letter policy, over values (no broker)."""

from __future__ import annotations

import uuid

import asyncpg
import pytest
import redis.exceptions

from contracts.models import DeadLetterKind, Status
from worker.broker.envelope import RoutableIds, Unreadable
from worker.faults import TransientError
from worker.pipeline import outcome
from worker.service.policy import (
    DeadLetter,
    Retry,
    RetryPolicy,
    route_conflict,
    route_failure,
    route_unreadable,
)

POLICY = RetryPolicy(max_attempts=4, base_delay_ms=1000, max_delay_ms=3000, draw=lambda low, high: high)


def test_a_bug_is_dead_lettered_at_once_with_an_internal_error_result() -> None:
    decision = route_failure(KeyError("boom"), 1, committed=False, policy=POLICY)
    assert isinstance(decision, DeadLetter)
    assert (decision.kind, decision.attempts) == (DeadLetterKind.INTERNAL, 1)
    assert decision.failure is not None
    assert decision.failure.status == Status.INTERNAL_ERROR
    # the exception's text stays in the dead letter's header and the log, out of what the model reads
    assert "boom" not in decision.failure.data["reason"]
    assert "KeyError" not in decision.failure.data["reason"]


@pytest.mark.parametrize(
    "exc",
    [
        TransientError("publish not confirmed"),
        ConnectionRefusedError(),
        redis.exceptions.ConnectionError("down"),
        asyncpg.exceptions.DeadlockDetectedError("deadlock"),
    ],
)
def test_a_transient_fault_is_retried_with_a_growing_delay_until_the_last_attempt(exc: Exception) -> None:
    decisions = [route_failure(exc, attempt, committed=False, policy=POLICY) for attempt in (1, 2, 3)]
    assert decisions == [Retry(1000, 1000, 1), Retry(2000, 2000, 2), Retry(3000, 3000, 3)]
    last = route_failure(exc, 4, committed=False, policy=POLICY)
    assert isinstance(last, DeadLetter)
    assert (last.kind, last.attempts) == (DeadLetterKind.TRANSIENT_EXHAUSTED, 4)
    assert last.failure is not None
    assert last.failure.status == Status.DB_ERROR


def test_after_a_commit_no_failure_result_is_sent_the_stored_answer_stands() -> None:
    exhausted = route_failure(TransientError("x"), 4, committed=True, policy=POLICY)
    assert isinstance(exhausted, DeadLetter)
    assert exhausted.failure is None
    bug = route_failure(ValueError("x"), 1, committed=True, policy=POLICY)
    assert isinstance(bug, DeadLetter)
    assert bug.failure is None


def test_the_delay_is_jittered_within_the_tier() -> None:
    policy = RetryPolicy(max_attempts=5, base_delay_ms=1000, max_delay_ms=60000, draw=lambda low, high: low)
    decision = route_failure(TransientError("x"), 2, committed=False, policy=policy)
    assert decision == Retry(tier_ms=2000, delay_ms=1500, attempts=2)


def test_a_cause_chain_reaching_a_transient_fault_is_transient() -> None:
    try:
        try:
            raise OSError("reset by peer")
        except OSError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        decision = route_failure(outer, 1, committed=False, policy=POLICY)
    assert isinstance(decision, Retry)


def test_the_tiers_double_from_the_base_up_to_the_cap_one_per_retry_queue() -> None:
    assert POLICY.tiers() == [1000, 2000, 3000]
    assert RetryPolicy().tiers() == [1000, 2000, 4000, 8000]
    assert RetryPolicy(max_attempts=1).tiers() == []  # no retry, no retry queue
    assert RetryPolicy(max_attempts=9, base_delay_ms=500, max_delay_ms=1000).tiers() == [500, 1000]


@pytest.mark.parametrize("policy", [POLICY, RetryPolicy(), RetryPolicy(max_attempts=9, max_delay_ms=5000)])
def test_every_retry_goes_to_a_declared_tier(policy: RetryPolicy) -> None:
    used = {
        decision.tier_ms
        for attempt in range(1, policy.max_attempts)
        if isinstance(
            decision := route_failure(TransientError("x"), attempt, committed=False, policy=policy), Retry
        )
    }
    assert used == set(policy.tiers())


def test_an_unreadable_body_is_dead_lettered_at_once_and_answered_only_when_its_ids_were_read() -> None:
    ids = RoutableIds(uuid.uuid4(), "call_1", 7, "create_long_term_memory")
    answered = route_unreadable(Unreadable(DeadLetterKind.SCHEMA, "arguments: not an object", ids))
    assert (answered.kind, answered.attempts) == (DeadLetterKind.SCHEMA, 1)
    assert answered.failure is not None
    assert answered.failure.status == Status.INTERNAL_ERROR
    unanswered = route_unreadable(Unreadable(DeadLetterKind.MALFORMED, "not JSON"))
    assert unanswered == DeadLetter(DeadLetterKind.MALFORMED, 1, None)


def test_a_conflicting_event_is_dead_lettered_with_the_refusal() -> None:
    decision = route_conflict(3)
    assert (decision.kind, decision.attempts) == (DeadLetterKind.EVENT_CONFLICT, 3)
    assert decision.failure is not None
    assert decision.failure.status == Status.INTERNAL_ERROR
    assert decision.failure.data["reason"] == outcome.EVENT_CONFLICT_REASON
