"""How long to wait before the next try at a dependency that does not answer (RabbitMQ, Postgres, Redis).

The step doubles from ``first`` up to ``cap``, and each wait is drawn between half the step and the whole
step: a fleet of workers that lost the same broker at the same moment comes back spread over the window
instead of in one wave, and none of them idles for more than ``cap`` once the broker answers again.
"""

from __future__ import annotations

import random
from collections.abc import Callable

#: first wait, and the longest one: a broker back from a restart is used within 3 s
FIRST_SECONDS = 0.5
CAP_SECONDS = 3.0


class Backoff:
    """Successive waits between tries; :meth:`reset` after a success."""

    def __init__(
        self,
        first: float = FIRST_SECONDS,
        cap: float = CAP_SECONDS,
        *,
        draw: Callable[[float, float], float] = random.uniform,
    ) -> None:
        if not 0 < first <= cap:
            raise ValueError("need 0 < first <= cap")
        self.first = first
        self.cap = cap
        self._draw = draw
        self._step = first

    def next(self) -> float:
        """The wait before the next try (between half the current step and all of it)."""
        step = self._step
        self._step = min(step * 2, self.cap)
        return self._draw(step / 2, step)

    def reset(self) -> None:
        self._step = self.first
