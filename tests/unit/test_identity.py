"""Who may speak for a shard (worker/service/identity.py, CONTRACT.md section 2): the rule over values."""

from __future__ import annotations

import pytest

from worker.service.identity import IdentityRule


def rule(mode: str, **kwargs: object) -> IdentityRule:
    return IdentityRule(mode, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("mode", "sender", "shard", "refused", "answer_to"),
    [
        # the shard's own user, everywhere
        ("checked", "shard-3", 3, False, None),
        ("required", "shard-3", 3, False, None),
        # another shard's user: refused unless nothing is checked; answered to the sender's own shard
        ("checked", "shard-5", 3, True, 5),
        ("required", "shard-5", 3, True, 5),
        ("shared", "shard-5", 3, False, None),
        # no user_id: version 1's way, refused only where it is required (and then answered to nobody)
        ("checked", None, 3, False, None),
        ("required", None, 3, True, None),
        ("shared", None, 3, False, None),
        # a user that is no shard's (a shared bot user, a developer's guest)
        ("checked", "guest", 3, False, None),
        ("required", "guest", 3, True, None),
        # a trusted publisher (the operator's replays) speaks for any shard
        ("checked", "operator", 3, False, None),
        ("required", "operator", 3, False, None),
        # names that look like a shard's user but are not of its form
        ("checked", "shard-03", 3, False, None),
        ("checked", "shard-3x", 3, False, None),
        ("required", "shard-03", 3, True, None),
        ("checked", "shard-99999999999", 3, False, None),
    ],
)
def test_the_rule(mode: str, sender: str | None, shard: int, refused: bool, answer_to: int | None) -> None:
    verdict = rule(mode).check(sender, shard)
    assert (verdict is not None) is refused
    if verdict is not None:
        assert verdict.sender_shard == answer_to
        assert f"shard {shard}" in verdict.reason


def test_a_trusted_publishers_own_event_speaks_for_any_shard_even_where_required() -> None:
    assert rule("required").check("operator", 7, trusted_sender=True) is None
    assert rule("required").check(None, 7, trusted_sender=True) is None


def test_the_shard_user_form_is_one_setting() -> None:
    bots = rule("required", user_format="bot-{shard_id}.prod", trusted=frozenset({"ops"}))
    assert bots.user_of(12) == "bot-12.prod"
    assert bots.shard_of("bot-12.prod") == 12
    assert bots.shard_of("bot-12.prodx") is None
    assert bots.check("bot-12.prod", 12) is None
    assert bots.check("ops", 12) is None
    refused = bots.check("bot-4.prod", 12)
    assert refused is not None
    assert refused.sender_shard == 4


def test_the_refusal_says_which_user_named_which_shard_and_whose_user_it_is() -> None:
    refused = rule("checked").check("shard-5", 3)
    assert refused is not None
    assert refused.reason == "user 'shard-5' may not speak for shard 3 (its user is 'shard-3')"
    missing = rule("required").check(None, 3)
    assert missing is not None
    assert "no user_id" in missing.reason
    assert "'shard-3'" in missing.reason
