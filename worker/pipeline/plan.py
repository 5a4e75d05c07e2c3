"""A save that passed every rule but the limit: :class:`SavePlan`, what :func:`worker.pipeline.steps.decide`
returns for it, and :class:`Target`, the user a personal memory is about.

Plain data. The notice is rendered from the plan (:func:`worker.pipeline.notice.notice_for`), the limit is
checked against it (:mod:`worker.pipeline.limits`), and its outcome is built from it
(:func:`worker.pipeline.steps.saved`).
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.pipeline.outcome import SERVER_WIDE, TARGET_USER, Invalidation
from worker.pipeline.state import PersonaState, ServerState, UserRecord


@dataclass(frozen=True, slots=True)
class Target:
    """The user a personal memory is about: the resolver's label for them and their ``users`` row."""

    label: str
    user: UserRecord


@dataclass(frozen=True, slots=True)
class SavePlan:
    """What to lock, count and insert, and who it is by and about.

    ``target`` is ``None`` for a server-wide memory (owner: the server, ``author``'s row recorded as its
    author) and the user for a personal one (owner: that user, no author recorded). The invalidation is
    ready; only the memory id is missing.
    """

    content: str
    server: ServerState
    persona: PersonaState
    author: UserRecord
    target: Target | None
    invalidation: Invalidation

    @property
    def scope(self) -> str:
        """``server_wide`` or ``target_user``."""
        return SERVER_WIDE if self.target is None else TARGET_USER

    @property
    def owner_id(self) -> int:
        """The internal server id of a server-wide memory, the target's internal user id of a personal one."""
        return self.server.server_id if self.target is None else self.target.user.user_id

    @property
    def lineage_id(self) -> int:
        return self.persona.lineage_id

    @property
    def persona_id(self) -> int | None:
        """The persona a server-wide memory is saved under; ``None`` for a personal one."""
        return self.persona.persona_id if self.target is None else None

    @property
    def author_user_id(self) -> int | None:
        """The author's internal user id for a server-wide memory; ``None`` for a personal one."""
        return self.author.user_id if self.target is None else None

    @property
    def target_label(self) -> str | None:
        return None if self.target is None else self.target.label
