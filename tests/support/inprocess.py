"""Worker lives in the test's own event loop (``Worker.run(signals=False)``) and what they logged: the
harness of tests/integration/test_worker.py and of the other tests that need a worker without a process of
its own (the ``workers`` fixture is in tests/integration/conftest.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.support.harness import queue_depth
from tests.support.wait import eventually
from worker.config import Settings
from worker.runner import Worker

#: every wait's deadline: generous, for a loaded machine; a passing test never waits it out
WAIT = 60.0
WORK_QUEUE = "ltm.create_memory"
DLQ = "ltm.create_memory.dlq"


@dataclass
class Workers:
    """Worker lives in this test's event loop, one after another or side by side, and their captured log."""

    settings: Settings
    log: list[dict[str, Any]]
    running: list[tuple[Worker, asyncio.Task[int]]] = field(default_factory=list)

    def count(self, event: str) -> int:
        return sum(1 for line in self.log if line.get("event") == event)

    def lines(self, event: str) -> list[dict[str, Any]]:
        return [line for line in self.log if line.get("event") == event]

    async def wait_for_log(self, event: str, *, at_least: int = 1) -> None:
        def logged() -> bool:
            for _, task in self.running:
                if task.done():
                    raise AssertionError(f"a worker ended before logging {event!r}: {task.result()}")
            return self.count(event) >= at_least

        await eventually(logged, f"the worker logs {event!r} {at_least} time(s)")

    async def start(self, *, adapters: Mapping[str, Any] | None = None, **overrides: Any) -> Worker:
        """One more worker life (``adapters``: the pool, cache or tracer it is given); returns once it
        consumes."""
        consuming = self.count("consuming")
        worker = Worker(self.settings.model_copy(update=overrides), **(adapters or {}))
        self.running.append((worker, asyncio.create_task(worker.run(signals=False))))
        await self.wait_for_log("consuming", at_least=consuming + 1)
        return worker

    async def stop(self, worker: Worker) -> int:
        """Stop ``worker`` gracefully; its exit code."""
        [task] = [t for w, t in self.running if w is worker]
        worker.stop()
        code = await asyncio.wait_for(task, WAIT)
        self.running = [(w, t) for w, t in self.running if w is not worker]
        return code

    async def restart_twice(self, url: str) -> tuple[int, int]:
        """Two more worker lives on the same queues, each from its start to a graceful stop; then (work
        queue depth, DLQ depth) with no worker. A delivery a worker left unacked is back in the queue once
        its connection is closed: the depth counts it."""
        for _ in range(2):
            worker = await self.start()
            assert await self.stop(worker) == 0
        return await queue_depth(url, WORK_QUEUE), await queue_depth(url, DLQ)
