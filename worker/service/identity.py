"""Who may speak for a shard: the one rule behind ``LTM_SHARD_IDENTITY`` (CONTRACT.md section 2).

RabbitMQ checks an event's AMQP ``user_id`` against the user its connection logged in as (a publish that
names another user is refused: ``PRECONDITION_FAILED``), so a ``user_id`` on a delivery is a fact, not a
claim. This module decides whether that user may speak for the ``shard_id`` the body names:

- the shard's own user, ``LTM_SHARD_USER`` with the shard's number in it (``shard-3`` for shard 3);
- a trusted publisher (``LTM_TRUSTED_PUBLISHERS``: ``worker dlq replay`` runs as one), for any shard; a
  replay carries the sender recorded on its dead letter (``x-ltm-user-id``), and that sender is checked;
- in ``checked`` mode (the default), also a sender that is no shard's user (none at all, or a user not of
  the ``LTM_SHARD_USER`` form: a shared bot user, a developer's ``guest``), as contract version 1 allowed:
  what ``checked`` refuses is one shard's user speaking for another shard;
- nobody else: ``required`` refuses every other sender, none included; ``shared`` (one RabbitMQ user for
  every shard) checks nothing.

A refused event is dead-lettered as ``unverified_shard`` before anything is written; its answer goes to
the shard its sender is (:meth:`IdentityRule.shard_of`), never to the shard it named. No I/O here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from contracts.names import SHARD_USER

if TYPE_CHECKING:
    from worker.config import Settings


@dataclass(frozen=True, slots=True)
class Refused:
    """The sender may not speak for the event's shard: why, in one line for the dead letter and the log."""

    reason: str
    #: the shard the sender itself is (its answer goes there), when its user name says so
    sender_shard: int | None


@dataclass(frozen=True, slots=True)
class IdentityRule:
    """``LTM_SHARD_IDENTITY``, ``LTM_SHARD_USER`` and ``LTM_TRUSTED_PUBLISHERS`` as one rule."""

    mode: str = "checked"
    user_format: str = SHARD_USER
    trusted: frozenset[str] = frozenset({"operator"})

    @classmethod
    def of(cls, settings: Settings) -> IdentityRule:
        trusted = frozenset(name.strip() for name in settings.trusted_publishers.split(",") if name.strip())
        return cls(settings.shard_identity, settings.shard_user, trusted)

    @property
    def checks(self) -> bool:
        """False in ``shared`` mode: any publisher speaks for any shard."""
        return self.mode != "shared"

    def user_of(self, shard_id: int) -> str:
        """The RabbitMQ user of shard ``shard_id``."""
        return self.user_format.replace("{shard_id}", str(shard_id))

    def shard_of(self, user: str | None) -> int | None:
        """The shard whose user ``user`` is, or None (no user, a trusted publisher, another name)."""
        if not user:
            return None
        prefix, _, suffix = self.user_format.partition("{shard_id}")
        match = re.fullmatch(re.escape(prefix) + r"(0|[1-9][0-9]{0,9})" + re.escape(suffix), user)
        if match is None:
            return None
        shard = int(match.group(1))
        return shard if shard <= 2147483647 else None

    def check(self, sender: str | None, shard_id: int, *, trusted_sender: bool = False) -> Refused | None:
        """None when ``sender`` may speak for ``shard_id``, else why not.

        ``sender`` is the user that published the event: the delivery's ``user_id``, or the one recorded on
        the worker's own copy or on a trusted publisher's replay. ``trusted_sender``: the event came from a
        trusted publisher with no recorded sender (a fresh event an operator sent), which may speak for any
        shard."""
        if not self.checks or trusted_sender:
            return None
        if sender is None:
            if self.mode == "required":
                return Refused(
                    f"the event has no user_id; shard {shard_id} must publish as {self.user_of(shard_id)!r} "
                    "with user_id set (LTM_SHARD_IDENTITY=required)",
                    None,
                )
            return None
        if sender == self.user_of(shard_id) or sender in self.trusted:
            return None
        sender_shard = self.shard_of(sender)
        if sender_shard is None and self.mode == "checked":
            return None  # no shard's user: as contract version 1 allowed
        return Refused(
            f"user {sender!r} may not speak for shard {shard_id} (its user is {self.user_of(shard_id)!r})",
            sender_shard,
        )
