"""The memory limits of SPEC.md, as the pipeline applies them: the length of one memory (step 7) and the
number of memories a scope may hold (steps 9 and 10).

The values come from the settings (``worker.config.Limits``, which declares the ``MAX_*`` variables); the
pipeline names only what it reads (:class:`MemoryLimits`), so it does not depend on how they are configured.
The defaults are the current bot's.
"""

from __future__ import annotations

from typing import Protocol

from worker.pipeline import outcome
from worker.pipeline.outcome import Outcome
from worker.pipeline.plan import SavePlan
from worker.pipeline.text import utf16_length

#: ``MAX_SERVER_MEMORIES``: server-wide memories per ``(server, persona lineage)``
DEFAULT_MAX_SERVER_MEMORIES = 100
#: ``MAX_PERSONAL_MEMORIES``: personal memories per ``(user, persona lineage)``, lineage 0 included
DEFAULT_MAX_PERSONAL_MEMORIES = 100
#: ``MAX_MEMORY_LENGTH``: the longest memory, in UTF-16 code units
DEFAULT_MAX_MEMORY_LENGTH = 1000
#: ``MEMORY_NOTICE_PREVIEW_LIMIT``: code points of rendered content shown before "Show Full Memory"
DEFAULT_NOTICE_PREVIEW_LIMIT = 600


class MemoryLimits(Protocol):
    """The limits the pipeline reads (``worker.config.Limits`` has them)."""

    @property
    def max_server_memories(self) -> int: ...

    @property
    def max_personal_memories(self) -> int: ...

    @property
    def max_memory_length(self) -> int: ...

    @property
    def notice_preview_limit(self) -> int: ...


def too_long(content: str, limits: MemoryLimits) -> Outcome | None:
    """Step 7: the outcome for content longer than the limit (counted in UTF-16 code units), else None."""
    if utf16_length(content) > limits.max_memory_length:
        return outcome.content_too_long(limits.max_memory_length)
    return None


def max_for(plan: SavePlan, limits: MemoryLimits) -> int:
    """The number of memories the plan's scope may hold."""
    if plan.scope == outcome.SERVER_WIDE:
        return limits.max_server_memories
    return limits.max_personal_memories


def limit_reached(plan: SavePlan, count: int, limits: MemoryLimits) -> Outcome:
    """The limit-exceeded outcome for a scope that already holds ``count`` >= its maximum rows."""
    max_allowed = max_for(plan, limits)
    if plan.scope == outcome.SERVER_WIDE:
        return outcome.server_limit_reached(count, max_allowed)
    return outcome.personal_limit_reached(plan.target_label or "", count, max_allowed)
