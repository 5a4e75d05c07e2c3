"""The loaded users as the pipeline sees them: a mapping of UserRecords built from the rows on lookup."""

from __future__ import annotations

from typing import Any

import pytest

from worker.pipeline.state import UserRecord, UserRows

ALICE = "1150000000000000201"
BOB = "1150000000000000202"
NOBODY = "1150000000000000299"


def rows() -> dict[str, dict[str, Any]]:
    return {
        ALICE: {
            "user_id": 1,
            "user_disc_id": ALICE,
            "nickname": "Al",
            "privacy_level": 1,
            "blacklisted": True,
        },
        BOB: {"user_id": 2, "user_disc_id": BOB},
    }


def test_a_looked_up_user_is_the_record_of_its_row_built_once() -> None:
    users = UserRows(rows())
    alice = users[ALICE]
    assert alice == UserRecord(
        user_id=1, user_disc_id=ALICE, nickname="Al", privacy_level=1, blacklisted=True
    )
    assert users.get(ALICE) is alice
    assert users[BOB] == UserRecord(user_id=2, user_disc_id=BOB)


def test_an_id_without_a_row_is_absent() -> None:
    users = UserRows(rows())
    assert users.get(NOBODY) is None
    assert NOBODY not in users
    with pytest.raises(KeyError):
        users[NOBODY]


def test_it_is_the_mapping_of_every_row_as_a_record() -> None:
    users = UserRows(rows())
    assert ALICE in users
    assert len(users) == 2
    assert list(users) == [ALICE, BOB]
    assert users == {disc_id: UserRecord(**row) for disc_id, row in rows().items()}
    assert UserRows({}) == {}
    assert (
        repr(UserRows({BOB: rows()[BOB]}))
        == f"UserRows({{{BOB!r}: {UserRecord(user_id=2, user_disc_id=BOB)!r}}})"
    )
