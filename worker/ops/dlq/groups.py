"""Dead letters counted by group (kind, error class, shard): what ``list --group-by`` prints and the page
shows; pure, no broker needed."""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from worker.broker.dead_letters import Letter
from worker.broker.headers import rfc3339
from worker.ops.dlq.kinds import FAILS_AGAIN, hopeless, replay_note
from worker.ops.dlq.render import terminal_safe
from worker.ops.dlq.selection import group_value


@dataclass(slots=True)
class Group:
    """The dead letters of one group: how many, the oldest and newest failure, one event id to look at."""

    by: str
    value: str
    count: int = 0
    oldest: datetime | None = None
    newest: datetime | None = None
    #: the event id of the first dead letter of the group the pass met (near the front of the queue)
    sample_event_id: str | None = None
    #: the kinds its letters have (an error or shard group may span several)
    kinds: dict[str, int] = field(default_factory=dict)

    @property
    def selector(self) -> str:
        """What ``--group`` takes to select exactly this group."""
        return f"{self.by}={self.value}"

    def add(self, letter: Letter) -> None:
        self.count += 1
        if self.sample_event_id is None:
            self.sample_event_id = letter.event_id
        self.kinds[letter.kind] = self.kinds.get(letter.kind, 0) + 1
        at = letter.failed_at
        if at is not None:
            if self.oldest is None or at < self.oldest:
                self.oldest = at
            if self.newest is None or at > self.newest:
                self.newest = at

    def replay_command(self) -> str:
        """The exact command that replays this group (as a POSIX shell reads it)."""
        return f"worker dlq replay --group {shlex.quote(self.selector)}"

    @property
    def hopeless(self) -> list[str]:
        """Its kinds whose letters a replay cannot help (:mod:`worker.ops.dlq.kinds`)."""
        return hopeless(self.kinds)

    @property
    def replay_helps(self) -> str:
        """``yes``: a replay can succeed for every letter of the group; ``no``: for none; ``some``."""
        cannot = len(self.hopeless)
        return "yes" if cannot == 0 else "no" if cannot == len(self.kinds) else "some"

    def useful_replay(self) -> str | None:
        """The command that replays the letters of the group a replay can help (None: none can)."""
        cannot = self.hopeless
        if not cannot:
            return self.replay_command()
        can = [kind for kind in self.kinds if kind not in cannot]
        return f"{self.replay_command()} --kind {shlex.quote(','.join(can))}" if can else None

    def hint(self) -> str:
        """What to do about the group, in one sentence (per kind when it spans several)."""
        kinds = list(self.kinds)
        if len(kinds) == 1:
            return replay_note(kinds[0])
        cannot = self.hopeless
        if not cannot:
            return "replay once the cause is fixed (kinds " + ", ".join(kinds) + ")"
        return f"{FAILS_AGAIN} for its {', '.join(cannot)} letters (see each kind)"

    def as_json(self) -> dict[str, Any]:
        return {
            "group_by": self.by,
            "group": self.value,
            "selector": self.selector,
            "count": self.count,
            "oldest_failed_at": None if self.oldest is None else rfc3339(self.oldest),
            "newest_failed_at": None if self.newest is None else rfc3339(self.newest),
            "sample_event_id": self.sample_event_id,
            "kinds": dict(sorted(self.kinds.items())),
            "replay": self.replay_command(),
            "replay_helps": self.replay_helps,
            "hint": self.hint(),
        }


class Grouping:
    """Letters counted into groups of one field, largest group first."""

    def __init__(self, field: str) -> None:
        self.field = field
        self._groups: dict[str, Group] = {}

    def add(self, letter: Letter) -> None:
        value = group_value(letter, self.field)
        group = self._groups.get(value)
        if group is None:
            group = self._groups[value] = Group(self.field, value)
        group.add(letter)

    def extend(self, letters: Iterable[Letter]) -> Grouping:
        for letter in letters:
            self.add(letter)
        return self

    @property
    def groups(self) -> list[Group]:
        """Largest first; ties by value, so the order is stable."""
        return sorted(self._groups.values(), key=lambda g: (-g.count, g.value))


_COLUMNS = ("COUNT", "OLDEST", "NEWEST", "SAMPLE_EVENT_ID", "REPLAY_HELPS", "GROUP")
_WIDTHS = (6, 20, 20, 36, 12)


def group_header() -> str:
    return _row(_COLUMNS)


def group_line(group: Group) -> str:
    """One line per group; the last column is what ``--group`` takes (control characters escaped)."""
    return _row(
        (
            str(group.count),
            "-" if group.oldest is None else rfc3339(group.oldest)[:19] + "Z",
            "-" if group.newest is None else rfc3339(group.newest)[:19] + "Z",
            terminal_safe(group.sample_event_id or "-"),
            group.replay_helps,
            terminal_safe(group.selector),
        )
    )


def group_json_line(group: Group) -> str:
    return orjson.dumps(group.as_json()).decode()


def _row(cells: tuple[str, ...]) -> str:
    padded = [cell.ljust(width) for cell, width in zip(cells, _WIDTHS, strict=False)]
    return "  ".join([*padded, *cells[len(_WIDTHS) :]]).rstrip()
