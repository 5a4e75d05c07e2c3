"""What the monitoring files under deploy/ ask of the worker: the metric names their queries use."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "deploy" / "grafana" / "ltm-worker.json"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yaml"
ALERT_TESTS = REPO / "deploy" / "prometheus" / "alerts.test.yaml"
#: metric names a query may use: the worker's own and the default collectors' (process_*, python_*)
METRIC_NAME = re.compile(r"\b((?:ltm|process|python)_[a-z0-9_]+)\b")


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _strings_under(node: Any, keys: tuple[str, ...]) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in keys and isinstance(value, str):
                yield value
            else:
                yield from _strings_under(value, keys)
    elif isinstance(node, list):
        for item in node:
            yield from _strings_under(item, keys)


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the dashboard: panel targets and template variable queries."""
    return list(_strings_under(dashboard(), ("expr", "query", "definition")))


def metric_names_used() -> dict[str, set[str]]:
    """metric name -> where it is used (``dashboard``, ``alert <name>``)."""
    used: dict[str, set[str]] = {}
    for query in dashboard_queries():
        for name in METRIC_NAME.findall(query):
            used.setdefault(name, set()).add("dashboard")
    for rule in alert_rules():
        for name in METRIC_NAME.findall(rule["expr"]):
            used.setdefault(name, set()).add(f"alert {rule['alert']}")
    return used


def exposed_names(exposition: str) -> set[str]:
    """Sample names in a Prometheus text exposition (``foo_bucket``, ``foo_count``... as exposed)."""
    return {
        line.split("{", 1)[0].split(" ", 1)[0]
        for line in exposition.splitlines()
        if line and not line.startswith("#")
    }
