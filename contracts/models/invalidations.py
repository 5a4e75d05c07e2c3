"""Worker -> Redis: the cache invalidations a save publishes (CONTRACT.md section 6), by ``kind``, and the
``invalidation_id`` they share (recomputable by the shard, no way back to the ``event_id``).
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal
from uuid import UUID

from pydantic import Field, StrictStr

from contracts.models.fields import _Model


def invalidation_id(event_id: UUID) -> str:
    """The ``invalidation_id`` of the invalidations a save of ``event_id`` publishes (CONTRACT.md section 6).

    Hex SHA-256 of ``"tomori-ltm-invalidation:"`` and the event id in its canonical text form: the same on
    every re-emit, recomputable by the shard that sent the event, and no way back to the ``event_id``
    (which the ledger answers by)."""
    return hashlib.sha256(f"tomori-ltm-invalidation:{event_id}".encode()).hexdigest()


InvalidationId = Annotated[
    StrictStr,
    Field(
        pattern=r"^[0-9a-f]{64}$",
        description="opaque id of the save (hex SHA-256 of 'tomori-ltm-invalidation:' + event_id), "
        "the same on every re-emit; never the event_id",
    ),
]


class ServerStateInvalidation(_Model):
    """Redis: drop the cached server state after a server-wide save."""

    schema_version: Literal[1] = 1
    invalidation_id: InvalidationId
    kind: Literal["tomori_state"] = "tomori_state"
    server_disc_id: StrictStr


class UserInvalidation(_Model):
    """Redis: drop the cached user after a personal save (the target's Discord id)."""

    schema_version: Literal[1] = 1
    invalidation_id: InvalidationId
    kind: Literal["user"] = "user"
    user_disc_id: StrictStr


# pydantic picks the class by ``kind``; the JSON Schema spells it as plain ``oneOf`` + ``const``
CacheInvalidation = Annotated[ServerStateInvalidation | UserInvalidation, Field(discriminator="kind")]
