"""heap.freeze_startup: start-up's objects frozen out of the collector, young collections rarer (in a child
process: the collector's settings are the whole process's)."""

from __future__ import annotations

import json
import subprocess
import sys

from worker.runtime import heap


def test_freeze_startup_freezes_start_up_and_raises_the_thresholds() -> None:
    code = (
        "import gc, json; from worker.runtime import heap; before = gc.get_freeze_count(); "
        "heap.freeze_startup();"
        "print(json.dumps([before, gc.get_freeze_count(), gc.get_threshold()]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    before, frozen, threshold = json.loads(out)
    assert before == 0
    assert frozen > 1000  # the modules, classes and functions imported so far
    assert threshold == [heap.YOUNG_THRESHOLD, heap.OLDER_THRESHOLD, heap.OLDER_THRESHOLD]
