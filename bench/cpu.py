"""CPU time from /proc: the worker processes, the bench itself, and the services on this machine.

``utime + stime`` of a process (``/proc/<pid>/stat`` fields 14 and 15) is what it has spent on a CPU.
Snapshots before and after the measured window give each group's CPU seconds in it: ``worker`` (the
processes the bench started), ``bench`` (this process: the shards), and, found by process name,
``postgres``, ``rabbitmq`` (``beam.smp``, but not ``rabbitmqctl``, which is a ``beam.smp`` too) and
``redis``. The services are only counted when they run on this machine; a process that started in the
window counts whole, one that ended in it is lost. Machine-wide busy time comes from ``/proc/stat``;
what the groups do not explain is ``other``: anything else running on the machine (another test run, a
``rabbitmqctl``), and kernel work not charged to a process. Off Linux there are no figures.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: process name (``/proc/<pid>/comm``) -> group
SERVICE_GROUPS = {"postgres": "postgres", "beam.smp": "rabbitmq", "redis-server": "redis"}


def process_cpu_seconds(pid: int) -> float | None:
    """``utime + stime`` of ``pid`` in seconds; ``None`` when it is gone or unreadable."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) ": fields from #3 on
    return (int(fields[11]) + int(fields[12])) / TICKS


def _machine() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine since boot."""
    try:
        first = (PROC / "stat").read_text().splitlines()[0].split()
    except OSError:
        return None
    values = [int(v) for v in first[1:9]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values)
    return (total - idle) / TICKS, total / TICKS


def _services() -> dict[int, str]:
    found: dict[int, str] = {}
    try:
        entries = list(PROC.iterdir())
    except OSError:
        return found
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        group = SERVICE_GROUPS.get(comm)
        if group is None or (group == "rabbitmq" and _is_rabbitmqctl(entry)):
            continue
        found[int(entry.name)] = group
    return found


def _is_rabbitmqctl(entry: Path) -> bool:
    """``rabbitmqctl`` and friends run as an escript on their own ``beam.smp``: not the broker."""
    try:
        return b"escript" in (entry / "cmdline").read_bytes()
    except OSError:
        return True


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
