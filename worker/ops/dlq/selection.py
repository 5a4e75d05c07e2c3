"""Which dead letters a command acts on (:class:`Selection`), and the groups ``--group-by`` and ``--group``
count and choose by (:func:`group_value`, :func:`parse_group`): pure, no broker needed."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from worker.broker.dead_letters import Letter

# --- choosing dead letters ----------------------------------------------------------------------------

_DURATION_PART = re.compile(r"(\d+)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_moment(text: str, now: datetime) -> datetime:
    """A point in time: RFC 3339 (``2026-12-06T08:00:00Z``), a date (``2026-12-06``, midnight UTC), or a
    duration ago (``2h``: two hours before ``now``); ValueError otherwise."""
    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"not a time: {text!r} (use 2026-12-06, 2026-12-06T08:00:00Z, or a duration ago such as 2h)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def parse_duration(text: str) -> timedelta:
    """``30s``, ``10m``, ``2h``, ``1d``, ``1w`` or a sum such as ``1h30m``; ValueError otherwise."""
    compact = text.strip().lower()
    parts = _DURATION_PART.findall(compact)
    if not parts or "".join(n + unit for n, unit in parts) != compact:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 10m, 2h, 1d or 1h30m)")
    return timedelta(seconds=sum(int(n) * _UNIT_SECONDS[unit] for n, unit in parts))


# --- groups ------------------------------------------------------------------------------------------

#: what ``--group-by`` and ``--group`` take: a letter's kind, its error normalised, the shard it names
GROUP_FIELDS = ("kind", "error", "shard")
#: the shard group of a dead letter whose body names no shard (not JSON, or no integer ``shard_id``)
NO_SHARD = "none"

_UUID = re.compile(r"\b[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}\b")
_HEX_ID = re.compile(r"\b(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b")
#: a number standing alone as a word: not part of a name (``UTF-8``, ``sha256``, ``8-4-4-4-12``, ``v1.2``);
#: a sign, a decimal or dotted part (``127.0.0.1``) and a unit (``30.5s``, ``64KiB``, ``5ms``) go with it
_NUMBER = re.compile(
    r"(?<![\w.+-])(?P<number>[-+]?[0-9]+(?:\.[0-9]+)*)(?P<unit>ms|s|m|h|d|B|KiB|MiB|GiB|KB|MB|GB|%)?(?![\w-])"
)
#: the project's own fixed sentences name their bounds after these words (``at most 100``, ``over the 262144
#: byte limit``, ``nested deeper than 1024 levels``): such a number is the rule, not the case, and stays
_BOUND_BEFORE = (
    "at most ",
    "at least ",
    "more than ",
    "less than ",
    "over the ",
    "over ",
    "deeper than ",
    "equal to ",
    "U+",
)
_SPACES = re.compile(r"\s+")
#: an error group's text is at most this long (the rest of a longer error is detail, not class)
MAX_ERROR_GROUP = 200


def normalise_error(error: str) -> str:
    """The error's class: ids (UUIDs, long hex) become ``<id>``, numbers that stand alone ``<n>`` (a bound the
    sentence states stays), blanks one space, so ``unknown schema_version 2`` and ``unknown schema_version 7``
    are one group while ``not UTF-8 JSON`` reads as it was written."""
    text = _UUID.sub("<id>", error)
    text = _HEX_ID.sub("<id>", text)
    text = _NUMBER.sub(_number_class, text)
    text = _SPACES.sub(" ", text).strip()
    return text[:MAX_ERROR_GROUP] if text else "-"


def _number_class(match: re.Match[str]) -> str:
    if match.string[: match.start()].endswith(_BOUND_BEFORE):
        return match.group()
    return "<n>" + (match.group("unit") or "")


def group_value(letter: Letter, field: str) -> str:
    """The group ``letter`` falls in when grouped by ``field`` (one of :data:`GROUP_FIELDS`)."""
    if field == "kind":
        return letter.kind
    if field == "error":
        return normalise_error(letter.error)
    if field == "shard":
        return NO_SHARD if letter.shard_id is None else str(letter.shard_id)
    raise ValueError(f"cannot group by {field!r} (use {', '.join(GROUP_FIELDS)})")


def parse_group(text: str) -> tuple[str, str]:
    """``kind=schema``, ``shard=3``, ``error=unknown schema_version <n>`` as (field, value); ValueError
    otherwise."""
    field, sep, value = text.partition("=")
    field = field.strip()
    if not sep or field not in GROUP_FIELDS:
        raise ValueError(
            f"not a group: {text!r} (use FIELD=VALUE with FIELD one of {', '.join(GROUP_FIELDS)}, as "
            "`worker dlq list --group-by FIELD` prints it)"
        )
    return field, value


@dataclass(frozen=True, slots=True)
class Selection:
    """Which dead letters a command acts on; empty means all. Filters combine with AND, values with OR."""

    kinds: frozenset[str] = frozenset()
    event_ids: frozenset[str] = frozenset()
    #: only dead letters that failed at least this long ago (unknown failure time: never selected)
    older_than: timedelta | None = None
    #: only the dead letters in these groups, (field, value) as :func:`parse_group` reads them; several
    #: groups of one field are OR-ed, of different fields AND-ed, like the other filters
    groups: frozenset[tuple[str, str]] = frozenset()
    #: only the letters whose body names one of these shards / guilds (``context.guild_disc_id``)
    shards: frozenset[int] = frozenset()
    guilds: frozenset[str] = frozenset()
    #: only the letters whose error (or first attempt's error) holds this text, in any case
    error: str | None = None
    #: only the letters that failed at or after ``since`` and before ``until`` (unknown failure time: never)
    since: datetime | None = None
    until: datetime | None = None

    def matches(self, letter: Letter, now: datetime) -> bool:
        if self.kinds and letter.kind not in self.kinds:
            return False
        if not self._found_by_search(letter):
            return False
        if self.groups and not self._in_groups(letter):
            return False
        # the event id the body names (the message_id only stands in for a body without one)
        if self.event_ids and letter.event_id not in self.event_ids:
            return False
        if self.older_than is not None:
            age = letter.age(now)
            if age is None or age < self.older_than:
                return False
        return True

    def _found_by_search(self, letter: Letter) -> bool:
        if self.shards and letter.shard_id not in self.shards:
            return False
        if self.guilds and letter.guild_id not in self.guilds:
            return False
        if self.error is not None and self.error.casefold() not in letter.errors.casefold():
            return False
        if self.since is not None or self.until is not None:
            if letter.failed_at is None:
                return False
            if self.since is not None and letter.failed_at < self.since:
                return False
            if self.until is not None and letter.failed_at >= self.until:
                return False
        return True

    def _in_groups(self, letter: Letter) -> bool:
        fields = {field for field, _ in self.groups}
        return all(
            group_value(letter, field) in {value for f, value in self.groups if f == field}
            for field in fields
        )

    def describe(self) -> dict[str, object]:
        """The filters as the audit records them (JSON-ready; empty ones left out)."""
        filters: dict[str, object] = {}
        if self.kinds:
            filters["kind"] = sorted(self.kinds)
        if self.event_ids:
            filters["event_id"] = sorted(self.event_ids)
        if self.older_than is not None:
            filters["older_than_seconds"] = int(self.older_than.total_seconds())
        if self.groups:
            filters["group"] = [f"{field}={value}" for field, value in sorted(self.groups)]
        if self.shards:
            filters["shard"] = sorted(self.shards)
        if self.guilds:
            filters["guild"] = sorted(self.guilds)
        if self.error is not None:
            filters["error"] = self.error
        if self.since is not None:
            filters["since"] = self.since.isoformat()
        if self.until is not None:
            filters["until"] = self.until.isoformat()
        return filters
