"""The bench's output: one table for people, one JSON object for scripts, from the same numbers."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, get_args

from bench.cpu import CpuUsage
from bench.shards import PhaseResult
from bench.workload import SAVED, PlannedEvent
from contracts.models import Status
from worker.config import Limits

CPU_GROUPS = ("worker", "postgres", "rabbitmq", "redis", "bench", "other")
#: the statuses in CONTRACT.md's order
STATUS_ORDER: tuple[str, ...] = get_args(Status)


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


@dataclass
class Run:
    """One subject measured: the worker fleet, or a ceiling."""

    key: str
    label: str
    warmup: PhaseResult
    measured: PhaseResult

    def latency_ms(self) -> dict[str, float]:
        values = sorted(self.measured.latencies)
        return {
            "p50": percentile(values, 50) * 1000,
            "p95": percentile(values, 95) * 1000,
            "p99": percentile(values, 99) * 1000,
            "max": (values[-1] if values else 0.0) * 1000,
        }

    @property
    def received(self) -> dict[str, str]:
        return {**self.warmup.received, **self.measured.received}

    @property
    def missing(self) -> int:
        return len(self.warmup.missing) + len(self.measured.missing)

    @property
    def errors(self) -> list[str]:
        return self.warmup.errors + self.measured.errors

    def cpu_per_thousand(self) -> dict[str, float]:
        cpu = self.measured.cpu
        return cpu.per_thousand(self.measured.answered) if cpu else {}

    def to_json(self) -> dict[str, Any]:
        m = self.measured
        cpu: CpuUsage | None = m.cpu
        return {
            "label": self.label,
            "events": m.events,
            "answered": m.answered,
            "warmup_events": self.warmup.events,
            "duration_s": round(m.duration, 4),
            "throughput_per_s": round(m.throughput, 2),
            "latency_ms": {k: round(v, 3) for k, v in self.latency_ms().items()},
            "cpu_s_per_1000_events": {k: round(v, 4) for k, v in self.cpu_per_thousand().items()},
            "machine_busy": round(cpu.machine_busy, 4) if cpu and cpu.machine_busy is not None else None,
            "missing": self.missing,
            "duplicates": self.warmup.duplicates + m.duplicates,
            "errors": self.errors[:20],
        }


@dataclass
class StatusCheck:
    """Counts by status against the workload's, over every event published (warmup included)."""

    expected: Counter[str]
    received: Counter[str]
    mismatches: list[tuple[PlannedEvent, str | None]]
    missing: int
    notices: int
    errors: list[str] = field(default_factory=list)

    @property
    def expected_notices(self) -> int:
        return self.expected[SAVED]

    @property
    def ok(self) -> bool:
        return (
            self.expected == self.received
            and not self.mismatches
            and not self.missing
            and not self.errors
            and self.notices == self.expected_notices
        )

    def to_json(self) -> dict[str, Any]:
        statuses = sorted(set(self.expected) | set(self.received), key=_status_rank)
        return {
            "ok": self.ok,
            # str(): the expected side's keys are Status members, a str subclass orjson refuses as keys
            "by_status": {
                str(s): {"expected": self.expected[s], "received": self.received[s]} for s in statuses
            },
            "missing": self.missing,
            "notices": {"expected": self.expected_notices, "received": self.notices},
            "mismatches": [
                {"event_id": e.event_id, "category": e.category, "expected": e.expected, "received": got}
                for e, got in self.mismatches[:50]
            ],
            "mismatch_count": len(self.mismatches),
            "errors": self.errors[:20],
        }


def _status_rank(status: str) -> int:
    return STATUS_ORDER.index(status) if status in STATUS_ORDER else len(STATUS_ORDER)


@dataclass
class BenchReport:
    """Everything one ``python -m bench`` run found."""

    config: dict[str, Any]
    world: dict[str, int]
    seeded: dict[str, int]
    limits: Limits
    categories: Counter[str]
    worker: Run
    check: StatusCheck
    rabbitmq: Run | None = None
    postgres: Run | None = None
    postgres_check: StatusCheck | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        ceilings_ok = all(
            run.missing == 0 and not run.errors for run in (self.rabbitmq, self.postgres) if run is not None
        )
        pg_ok = self.postgres_check is None or self.postgres_check.ok
        return self.check.ok and ceilings_ok and pg_ok

    def ratios(self) -> dict[str, float]:
        out = {}
        for run in (self.rabbitmq, self.postgres):
            if run is not None and run.measured.throughput > 0:
                out[run.key] = self.worker.measured.throughput / run.measured.throughput
        return out

    def to_json(self) -> dict[str, Any]:
        runs = {r.key: r.to_json() for r in (self.worker, self.rabbitmq, self.postgres) if r is not None}
        return {
            "ok": self.ok,
            "config": self.config,
            "world": self.world,
            "seeded_rows": self.seeded,
            "limits": {
                "max_server_memories": self.limits.max_server_memories,
                "max_personal_memories": self.limits.max_personal_memories,
                "max_memory_length": self.limits.max_memory_length,
            },
            "mix": dict(sorted(self.categories.items())),
            "runs": runs,
            "worker_vs_ceiling": {k: round(v, 4) for k, v in self.ratios().items()},
            "status_check": self.check.to_json(),
            "postgres_ceiling_status_check": self.postgres_check.to_json() if self.postgres_check else None,
            "notes": self.notes,
        }

    def table(self) -> str:
        c = self.config
        lines = [
            f"python -m bench: {c['events']:,} events measured (+{c['warmup']:,} warmup), "
            f"{c['shards']} shards, {c['mode']}; {c['fleet']}",
            f"world: {self.world['servers']:,} servers, {self.world['personas']:,} personas, "
            f"{self.world['users']:,} users ({self.world['users_with_row']:,} known), {c['members']} members "
            f"per server; seed {c['seed']}; limits {self.limits.max_server_memories}/"
            f"{self.limits.max_personal_memories}/{self.limits.max_memory_length}; "
            f"worker prefetch {c['prefetch']}, concurrency {c['concurrency']}, pool {c['pool_size']}",
            "",
        ]
        ratios = self.ratios()
        header = f"{'':<26}{'events':>8}{'duration':>11}{'events/s':>11}" + "".join(
            f"{p:>10}" for p in ("p50", "p95", "p99", "max")
        )
        lines.append(header + "   worker/ceiling")
        for run in (self.worker, self.rabbitmq, self.postgres):
            if run is None:
                continue
            lat = run.latency_ms()
            ratio = f"   {ratios[run.key]:.2f}" if run.key in ratios else ""
            lines.append(
                f"{run.label:<26}{run.measured.answered:>8,}{run.measured.duration:>9.2f} s"
                f"{run.measured.throughput:>11,.0f}"
                + "".join(f"{_ms(lat[k]):>10}" for k in ("p50", "p95", "p99", "max"))
                + ratio
            )
        lines += [
            "",
            f"{'CPU s per 1,000 events':<26}" + "".join(f"{g:>10}" for g in CPU_GROUPS) + "   machine busy",
        ]
        for run in (self.worker, self.rabbitmq, self.postgres):
            if run is None:
                continue
            per = run.cpu_per_thousand()
            cpu = run.measured.cpu
            busy = (
                f"   {cpu.machine_busy:.0%} of {cpu.cpus} CPUs"
                if cpu and cpu.machine_busy is not None
                else ""
            )
            cells = "".join(f"{per[g]:>10.3f}" if g in per else f"{'-':>10}" for g in CPU_GROUPS)
            lines.append(f"{run.label:<26}{cells}{busy}")
        lines.append(
            "  (worker: the worker processes, for (a) the echo consumers; bench: the shards, for (b) the "
            "driver; other: the rest of the machine's busy time)"
        )
        lines += ["", *self._status_lines("worker", self.check)]
        if self.postgres_check is not None:
            pg = self.postgres_check
            lines.append(
                f"(b) Postgres alone, same events: statuses {'match' if pg.ok else 'DO NOT match'} "
                f"({sum(pg.received.values()):,} processed, {len(pg.mismatches)} per-event mismatches)"
            )
        for run in (self.rabbitmq, self.postgres):
            if run is not None and (run.missing or run.errors):
                lines.append(f"{run.label}: {run.missing} events unanswered; {'; '.join(run.errors[:3])}")
        lines += [f"note: {n}" for n in self.notes]
        lines.append("RESULT: " + ("OK" if self.ok else "FAILED"))
        return "\n".join(lines)

    def _status_lines(self, who: str, check: StatusCheck) -> list[str]:
        total = sum(check.expected.values())
        title = f"status (every event published: {total:,})"
        lines = [f"{title:<48}{'expected':>10}{'received':>10}"]
        for status in sorted(set(check.expected) | set(check.received), key=_status_rank):
            e, r = check.expected[status], check.received[status]
            lines.append(f"  {status:<46}{e:>10,}{r:>10,}{'' if e == r else '   <-- differs'}")
        lines.append(
            f"  notices {check.notices:,} of {check.expected_notices:,}; unanswered {check.missing}; "
            f"duplicate results {self.worker.warmup.duplicates + self.worker.measured.duplicates}; "
            f"per-event mismatches {len(check.mismatches)}"
        )
        for event, got in check.mismatches[:5]:
            lines.append(f"    {event.event_id} ({event.category}): expected {event.expected}, got {got}")
        lines += [f"  error: {e}" for e in check.errors[:5]]
        return lines


def _ms(value: float) -> str:
    return f"{value:.1f} ms" if value < 100 else f"{value:.0f} ms"
