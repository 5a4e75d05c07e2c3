"""CPU time (psutil): the worker processes, the bench itself, and the services on this machine.

A process's user + system CPU time is what it has spent on a CPU. Snapshots before and after the measured
window give each group's CPU seconds in it: ``worker`` (the processes the bench started), ``bench`` (this
process: the shards), and, found by process name, ``postgres``, ``rabbitmq`` (``beam.smp``, but not
``rabbitmqctl``, which is a ``beam.smp`` too) and ``redis``. The services are only counted when they run on
this machine; a process that started in the window counts whole, one that ended in it is lost.
Machine-wide busy time is everything but idle and iowait; what the groups do not explain is ``other``:
anything else running on the machine (another test run, a ``rabbitmqctl``), and kernel work not charged to
a process. Where psutil cannot read a figure there is none.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

try:
    import psutil
except ModuleNotFoundError as exc:  # a checkout installed without the extra: say which, not a traceback
    print("the bench needs psutil: pip install -e '.[bench]' (or '.[test]')", file=sys.stderr)
    raise SystemExit(2) from exc

#: process name -> group
SERVICE_GROUPS = {"postgres": "postgres", "beam.smp": "rabbitmq", "redis-server": "redis"}


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid``; ``None`` when it is gone or unreadable."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return times.user + times.system


def _machine() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine since boot."""
    try:
        times = psutil.cpu_times()
    except (psutil.Error, OSError):
        return None
    # the kernel's first eight counters, as /proc/stat lists them (guest time is already in user)
    fields = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    total = sum(getattr(times, name, 0.0) for name in fields)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


def _services() -> dict[int, str]:
    found: dict[int, str] = {}
    for process in psutil.process_iter(["name", "cmdline"]):
        group = SERVICE_GROUPS.get(process.info["name"] or "")
        if group is None or (group == "rabbitmq" and _is_rabbitmqctl(process.info["cmdline"])):
            continue
        found[process.pid] = group
    return found


def _is_rabbitmqctl(cmdline: list[str] | None) -> bool:
    """``rabbitmqctl`` and friends run as an escript on their own ``beam.smp``: not the broker."""
    return cmdline is None or any("escript" in part for part in cmdline)


@dataclass(frozen=True, slots=True)
class CpuSnapshot:
    at: float
    by_pid: Mapping[int, tuple[str, float]]
    machine: tuple[float, float] | None


def snapshot(worker_pids: Iterable[int] = ()) -> CpuSnapshot:
    """CPU seconds so far of every process of interest."""
    groups: dict[int, str] = _services()
    for pid in worker_pids:
        groups[pid] = "worker"
    groups[os.getpid()] = "bench"
    by_pid = {}
    for pid, group in groups.items():
        seconds = process_cpu_seconds(pid)
        if seconds is not None:
            by_pid[pid] = (group, seconds)
    return CpuSnapshot(time.monotonic(), by_pid, _machine())


@dataclass(frozen=True, slots=True)
class CpuUsage:
    """CPU seconds spent in a window, by group, and how busy the machine was."""

    seconds: dict[str, float]
    wall: float
    machine_busy: float | None  # fraction of all CPUs
    cpus: int

    def per_thousand(self, events: int) -> dict[str, float]:
        return {group: s * 1000 / events for group, s in self.seconds.items()} if events else {}


def usage(before: CpuSnapshot, after: CpuSnapshot) -> CpuUsage:
    seconds: dict[str, float] = {}
    for pid, (group, end) in after.by_pid.items():
        start = before.by_pid.get(pid, (group, 0.0))[1]
        seconds[group] = seconds.get(group, 0.0) + max(0.0, end - start)
    busy = None
    if before.machine and after.machine and after.machine[1] > before.machine[1]:
        busy_seconds = after.machine[0] - before.machine[0]
        busy = busy_seconds / (after.machine[1] - before.machine[1])
        seconds["other"] = max(0.0, busy_seconds - sum(seconds.values()))
    return CpuUsage(seconds, after.at - before.at, busy, os.cpu_count() or 1)
