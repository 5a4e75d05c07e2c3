"""The Grafana dashboard and the Prometheus alert rules under deploy/, checked offline.

promtool (Debian's `prometheus` package; .ci/run installs it) checks the rules and runs their unit tests
(deploy/prometheus/alerts.test.yaml). That every metric they name exists on a live worker is
tests/e2e/test_observability.py's job.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tests.monitoring import ALERT_TESTS, ALERTS, METRIC_NAME, REPO, alert_rules, dashboard, dashboard_queries


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: .ci/run installs Debian's prometheus package, which has it")
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    return found


def run_promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )


def test_the_alert_rules_pass_promtool_check() -> None:
    done = run_promtool("check", "rules", ALERTS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in done.stdout


def test_the_alert_rules_pass_their_unit_tests() -> None:
    done = run_promtool("test", "rules", ALERT_TESTS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_unit_tests_catch_a_broken_dead_letter_alert(tmp_path: Path) -> None:
    """The DLQ alert's unit test fails when the rule stops looking at the DLQ's growth."""
    broken = ALERTS.read_text(encoding="utf-8").replace(
        'delta(ltm_queue_messages{queue="ltm.create_memory.dlq"}[10m])) > 0',
        'delta(ltm_queue_messages{queue="ltm.create_memory.dlq"}[10m])) > 5',
    )
    assert broken != ALERTS.read_text(encoding="utf-8")
    (tmp_path / "alerts.yaml").write_text(broken, encoding="utf-8")
    (tmp_path / "alerts.test.yaml").write_text(ALERT_TESTS.read_text(encoding="utf-8"), encoding="utf-8")
    done = run_promtool("test", "rules", tmp_path / "alerts.test.yaml")
    assert done.returncode != 0
    assert "LtmDeadLettersGrowing" in done.stdout + done.stderr


def test_the_unit_tests_catch_a_shard_alert_that_adds_up_every_pods_copy_of_a_queue(tmp_path: Path) -> None:
    """Every pod samples the same depth of a shard's own queue: the loud-shard alert takes the max over pods,
    and its unit test fails when the rule sums the copies instead."""
    source = ALERTS.read_text(encoding="utf-8")
    max_over_pods = "max by (namespace, shard) (ltm_shard_events_queued)"
    broken = source.replace(max_over_pods, max_over_pods.replace("max", "sum"))
    assert broken != source
    (tmp_path / "alerts.yaml").write_text(broken, encoding="utf-8")
    (tmp_path / "alerts.test.yaml").write_text(ALERT_TESTS.read_text(encoding="utf-8"), encoding="utf-8")
    done = run_promtool("test", "rules", tmp_path / "alerts.test.yaml")
    assert done.returncode != 0
    assert "LtmOneShardHoldsTheBacklog" in done.stdout + done.stderr


def test_every_alert_has_a_runbook_a_severity_and_a_firing_test_case() -> None:
    tests = yaml.safe_load(ALERT_TESTS.read_text(encoding="utf-8"))["tests"]
    firing = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case["exp_alerts"]}
    quiet = {
        case["alertname"] for test in tests for case in test["alert_rule_test"] if not case["exp_alerts"]
    }
    for rule in alert_rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert {"summary", "description", "runbook"} <= set(rule["annotations"]), name
        assert name in firing, f"{name} has no test case where it fires"
        assert name in quiet, f"{name} has no test case where it stays quiet"
    assert "worker dlq list --kind" in " ".join(r["annotations"]["runbook"] for r in alert_rules())


def test_the_loud_shard_runbook_is_the_paragraph_of_docs_operating_word_for_word() -> None:
    """The person who runs `worker shards` from a terminal reads docs/operating.md, the one paged reads the
    alert's runbook: the same text, so neither is left behind when the other changes."""
    page = (REPO / "docs" / "operating.md").read_text(encoding="utf-8")
    found = re.search(r"^\*\*A loud shard: what to do\.\*\* (.*?)\n\n", page, re.MULTILINE | re.DOTALL)
    assert found, 'docs/operating.md has no paragraph "A loud shard: what to do"'
    [rule] = [rule for rule in alert_rules() if rule["alert"] == "LtmOneShardHoldsTheBacklog"]
    pointer = 'docs/operating.md "A loud shard: what to do". '
    assert rule["annotations"]["runbook"] == pointer + " ".join(found.group(1).split())


def test_the_dashboard_is_one_grafana_dashboard_on_a_prometheus_variable() -> None:
    board = dashboard()
    assert board["uid"] == "ltm-worker"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = board["panels"]
    ids = Counter(panel["id"] for panel in panels)
    assert all(count == 1 for count in ids.values()), ids
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["description"], panel["title"]
        for target in panel["targets"]:
            assert METRIC_NAME.search(target["expr"]), target["expr"]
            assert 'job=~"$job"' in target["expr"], f"{panel['title']}: {target['expr']} ignores $job"


#: what Grafana puts in place of the dashboard's variables, for promtool
VARIABLES = {"$__rate_interval": "5m", "$job": ".+", "$top": "10"}


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    """Each panel's query, its variables filled in as Grafana would, parses (as a recording rule's expr)."""
    rules = []
    for number, panel in enumerate(p for p in dashboard()["panels"] if p["type"] != "row"):
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in VARIABLES.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"{panel['title']}: a variable this test does not know: {expr}"
            rules.append({"record": f"panel_{number}_{target['refId']}", "expr": expr})
    (tmp_path / "queries.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}), encoding="utf-8"
    )
    done = run_promtool("check", "rules", tmp_path / "queries.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout


def test_the_dashboard_has_the_panels_an_on_call_person_needs() -> None:
    queries = " ".join(dashboard_queries())
    for needed in (
        "ltm_events_total",  # rate by status
        "ltm_event_duration_seconds_bucket",  # latency
        "ltm_event_age_seconds_bucket",  # event age
        "ltm_queue_wait_seconds_bucket",
        "ltm_retries_total",
        "ltm_dead_letters_total",  # by kind
        'queue="ltm.create_memory.dlq"',  # DLQ depth
        "ltm_events_in_flight",
        "ltm_dependency_up",
        "ltm_db_batch_size",
        "process_cpu_seconds_total",  # per pod
        "ltm_shard_events_received_total",  # who is loud: each shard's share of the events in
        "ltm_shard_events_held",  # waiting by shard: held by the workers
        "ltm_shard_events_queued",  # and ready in the shard's own queue
        "ltm_shard_wait_seconds_bucket",  # the wait p99 by shard
    ):
        assert needed in queries, needed
