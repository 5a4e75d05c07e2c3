"""The dead letters the worker writes (CONTRACT.md "Dead letters"): their ``x-ltm-error-kind`` and the
headers it adds to a message it moves to the DLQ.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import AwareDatetime, ConfigDict, Field, StrictInt, StrictStr

from contracts import names
from contracts.models.fields import _Model


class DeadLetterKind(StrEnum):
    """``x-ltm-error-kind`` of a dead letter the worker writes (CONTRACT.md "Dead letters")."""

    MALFORMED = "malformed"
    SCHEMA = "schema"
    TRANSIENT_EXHAUSTED = "transient_exhausted"
    INTERNAL = "internal"
    #: the event's ``event_id`` is in the ledger for a different event (CONTRACT.md "Dead letters")
    EVENT_CONFLICT = "event_conflict"
    #: the RabbitMQ user that published the event may not speak for its ``shard_id`` (CONTRACT.md section 2)
    UNVERIFIED_SHARD = "unverified_shard"
    #: the event's shard already had its bound of events waiting; it was not processed (CONTRACT.md section 2)
    SHARD_BACKLOG_FULL = "shard_backlog_full"


class DeadLetterHeaders(_Model):
    """Headers the worker adds to a message it moves to ``ltm.create_memory.dlq``."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    error: StrictStr = Field(alias=names.ERROR_HEADER, description="one line, human readable")
    error_kind: DeadLetterKind = Field(alias=names.ERROR_KIND_HEADER)
    attempts: Annotated[StrictInt, Field(ge=1)] = Field(alias=names.ATTEMPTS_HEADER)
    failed_at: AwareDatetime = Field(alias=names.FAILED_AT_HEADER, description="RFC 3339")
