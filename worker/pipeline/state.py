"""Plain data the pipeline decides on: what the service loaded from Postgres for one event.

No I/O here. The store builds these values inside the event's transaction; the pipeline reads them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

#: users.privacy_level values (original ``PrivacyLevel``).
PRIVACY_MINIMAL = 0
PRIVACY_PARTIAL = 1
PRIVACY_FULL = 2


@dataclass(frozen=True, slots=True)
class NamingConfig:
    """A persona's ``persona_naming_configs``: prefix/suffix per addressing style.

    Keys are addressing styles (``masculine``, ``feminine``, ``neutral``); values are the configured
    strings. Anything that was not a string in the JSONB is dropped when the store builds this.
    """

    prefixes: Mapping[str, str] = field(default_factory=dict)
    suffixes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PersonaState:
    """The responding persona (``personas`` row that belongs to the event's server)."""

    persona_id: int
    nickname: str
    lineage_id: int
    naming: NamingConfig = field(default_factory=NamingConfig)


@dataclass(frozen=True, slots=True)
class ServerState:
    """The ``servers`` row and its ``server_member_permissions_configs`` flags (missing row: both true)."""

    server_id: int
    server_disc_id: str
    self_teaching_enabled: bool = True
    personal_memories_enabled: bool = True


@dataclass(frozen=True, slots=True)
class UserRecord:
    """A ``users`` row with its naming for the persona's lineage and its blacklist state on this server."""

    user_id: int
    user_disc_id: str
    privacy_level: int = PRIVACY_MINIMAL
    #: a ``user_personalization_configs`` row exists (the composed-name stage needs one)
    has_personalization: bool = False
    #: ``user_personalization_configs``: the saved global nickname and the user's own affixes
    nickname: str | None = None
    prefix_override: str | None = None
    suffix_override: str | None = None
    addressing_style: str | None = None
    #: ``user_persona_naming_preferences`` for the persona's lineage
    persona_nickname: str | None = None
    persona_prefix_override: str | None = None
    persona_suffix_override: str | None = None
    #: on ``personalization_blacklist`` for the event's server
    blacklisted: bool = False


class UserRows(Mapping[str, UserRecord]):
    """Loaded ``users`` rows by Discord id, each made a :class:`UserRecord` the first time it is looked up.

    A ``target_user`` event loads every guild member the resolver may pick from (dozens), and the
    pipeline reads the records of a few of them: building every one up front was a sizeable share of
    the worker's CPU. ``rows`` hold :class:`UserRecord`'s fields by name; each is read once, at most.
    """

    __slots__ = ("_records", "_rows")

    def __init__(self, rows: Mapping[str, Mapping[str, Any]]) -> None:
        self._rows = rows
        self._records: dict[str, UserRecord] = {}

    def __getitem__(self, disc_id: str) -> UserRecord:
        record = self._records.get(disc_id)
        if record is None:
            record = self._records[disc_id] = UserRecord(**self._rows[disc_id])
        return record

    def __contains__(self, disc_id: object) -> bool:
        return disc_id in self._rows

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self)!r})"


@dataclass(frozen=True, slots=True)
class LoadedState:
    """Everything the pipeline may consult for one event.

    ``users`` is keyed by Discord id and holds every known user among: the triggering user, the
    guild members and participants of the event, and the ids mentioned (``<@id>``) in the content.
    An id that is not a key has no ``users`` row.
    """

    server: ServerState | None
    persona: PersonaState | None
    users: Mapping[str, UserRecord] = field(default_factory=dict)
