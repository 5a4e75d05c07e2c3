"""A child process of a simulation: worker/testing/process.py's ``ModuleProcess``, run in this checkout.

It runs in the checkout (so ``python -m bench.echo`` resolves however the parent started). The e2e tests read
its JSON log lines; the bench only needs it alive and stopped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from worker.testing.process import TAIL_CHARS, ProcessFailed, stop_all
from worker.testing.process import ModuleProcess as _ModuleProcess

__all__ = ["CHECKOUT", "TAIL_CHARS", "ModuleProcess", "ProcessFailed", "stop_all"]

CHECKOUT = Path(__file__).resolve().parents[1]


class ModuleProcess(_ModuleProcess):
    """``python -m module *args`` in the checkout, with its own log file (appended to)."""

    def __init__(
        self,
        module: str,
        args: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        name: str,
        *,
        cwd: Path = CHECKOUT,
    ) -> None:
        """``cwd``: the checkout the module is imported from (another one runs that one's code)."""
        super().__init__(module, args, env, log_path, name, cwd=cwd)
