"""What ``python -m bench latency`` prints: each series' figures, the table, the worker's spans
(``--stages``)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.report import percentile


def summary(values_ms: list[float]) -> dict[str, float]:
    values = sorted(values_ms)
    out = {f"p{p}": round(percentile(values, p), 3) for p in (50, 90, 99)}
    out["max"] = round((values or [0.0])[-1], 3)
    out["n"] = len(values)
    return out


def table(report: dict[str, Any]) -> str:
    head = (
        f"{'rate/s':>6}  {'path':<10} {'calls':>5}  {'p50':>7}  {'p90':>7}  {'p99':>7}  {'max':>7}  errs"
        "  cpu ms/call  shard cpu"
    )
    lines = ["latency of one call, ms, from its scheduled send to its result (open loop)", head]
    for s in report["series"]:
        cells = "  ".join(f"{s[k]:7.1f}" for k in ("p50", "p90", "p99", "max"))
        cpu = "" if s["cpu_ms_per_call"] is None else f"{s['cpu_ms_per_call']:12.2f}"
        shard = "" if s["shard_cpu_ms_per_call"] is None else f"{s['shard_cpu_ms_per_call']:11.2f}"
        lines.append(
            f"{s['rate']:>6g}  {s['path']:<10} {s['calls']:>5}  {cells}  {s['errors']:>4}{cpu}{shard}"
        )
    c = report["postgres_commit_ms"]
    lines.append(
        f"postgres single-row INSERT commit ({c['n']} in a row): p50 {c['p50']:.2f}  p90 {c['p90']:.2f}  "
        f"p99 {c['p99']:.2f}  max {c['max']:.2f} ms"
    )
    lines.append(
        f"worker idle: {report['worker_idle_cpu_ms_per_s']:.1f} ms CPU per second; cpu ms/call: the answering"
        " process's CPU over the series (idle gaps included) per call, in 10 ms ticks; shard cpu: the"
        " caller's (Node, or the bench's own Python process), per call"
    )
    if report["stages_ms"]:
        lines.append("worker spans (every series above), ms:")
        for name, figures in report["stages_ms"].items():
            lines.append(
                f"  {name:<36} n {figures['n']:>5}  p50 {figures['p50']:7.2f}  p90 {figures['p90']:7.2f}  "
                f"p99 {figures['p99']:7.2f}"
            )
    lines.append(f"load average {report['load_average']} on {report['cpus']} cpus")
    return "\n".join(lines)


def span_durations(log_path: Path) -> dict[str, dict[str, float]]:
    """Each span name's durations in the worker's log (``LTM_TRACING=console``: one JSON span per line)."""
    by_name: dict[str, list[float]] = {}
    for raw in log_path.read_text(errors="replace").splitlines():
        if not raw.startswith("{") or '"start_time"' not in raw:
            continue
        try:
            span = json.loads(raw)
            start = datetime.fromisoformat(span["start_time"])
            end = datetime.fromisoformat(span["end_time"])
        except (ValueError, KeyError, TypeError):
            continue
        by_name.setdefault(str(span.get("name")), []).append((end - start).total_seconds() * 1000)
    return {name: summary(values) for name, values in sorted(by_name.items(), key=lambda kv: -len(kv[1]))}
