"""The write items of the repository serialise to exactly the keys ``ltm_save_events`` reads."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from pathlib import Path

from contracts.models import Status
from worker.store import repository as repo

#: the latest migration that (re)defines ltm_save_events (0004, then 0006 with the event digest)
MIGRATION = [
    path
    for path in sorted((Path(repo.__file__).parent / "migrations").glob("*.sql"))
    if "CREATE OR REPLACE FUNCTION public.ltm_save_events" in path.read_text()
][-1]
NOW = datetime(2026, 12, 3, 10, tzinfo=UTC)


def keys_read(branch: str) -> set[str]:
    """The item keys one branch of ``ltm_save_events`` reads (``item->>'key'`` / ``item->'key'``)."""
    function = MIGRATION.read_text().split("CREATE OR REPLACE FUNCTION public.ltm_save_events")[1]
    function = function.split("CREATE OR REPLACE FUNCTION")[0]
    save, record = function.split("ELSIF item->>'kind' = 'record' THEN")
    body = save.split("IF item->>'kind' = 'save' THEN")[1] if branch == "save" else record
    return set(re.findall(r"item->>?'(\w+)'", body)) | {"kind"}


def save_item() -> repo.SaveItem:
    return repo.SaveItem(
        uuid.uuid4(),
        "call_1",
        "create_long_term_memory",
        3,
        scope="server_wide",
        owner_id=1,
        lineage_id=10000,
        persona_id=7,
        author_id=2,
        content="likes tea",
        max_allowed=100,
        result={"status": Status.SAVED},
        notice={"kind": "server_memory"},
        invalidation={"kind": "tomori_state"},
        attempts=1,
        processed_at=NOW,
    )


def record_item() -> repo.RecordItem:
    return repo.RecordItem(
        uuid.uuid4(),
        "call_2",
        "remember_this_fact",
        4,
        status=Status.DISABLED,
        scope=None,
        result={"status": Status.DISABLED},
        attempts=2,
        processed_at=NOW,
    )


def test_a_save_item_has_every_key_the_save_branch_reads_and_no_other() -> None:
    payload = repo._item_json(save_item(), 5)
    assert set(payload) == keys_read("save")
    assert (payload["kind"], payload["i"], payload["processed_at"]) == ("save", 5, NOW.isoformat())


def test_a_record_item_has_every_key_the_record_branch_reads_and_no_other() -> None:
    payload = repo._item_json(record_item(), 0)
    assert set(payload) == keys_read("record")
    assert (payload["kind"], payload["status"], payload["scope"]) == (
        "record",
        Status.DISABLED,
        None,
    )
