"""Prometheus config, alert rules and the Grafana dashboard: checked by promtool, alert rules
unit-tested, and every metric and label they use present in the router's own registry."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.fleet.kvfollow import StreamMetrics
from router.observe.metrics import Metrics
from tests.deploy.promql import (
    SYNTHETIC,
    TARGET_LABELS,
    Family,
    grouping_labels,
    registry_families,
    selectors,
)
from tests.deploy.tools import DEPLOY, check_promql, require_tool, run

PROMETHEUS = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "lane-router.json"
# Grafana's variables, replaced by something Prometheus accepts before promtool reads a query.
_GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


@pytest.fixture(scope="module")
def promtool() -> str:
    return require_tool("promtool")


@pytest.fixture(scope="module")
def families() -> dict[str, Family]:
    metrics = Metrics()
    metrics.registry.register(StreamMetrics(lambda: ()))  # the KV event streams' families
    return registry_families(metrics.registry)


def rules() -> list[dict[str, Any]]:
    data = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text(encoding="utf-8"))
    return [rule for group in data["groups"] for rule in group["rules"]]


def recorded(rule_list: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Recording rule name → the labels its series keep (those it groups by)."""
    return {r["record"]: grouping_labels(r["expr"]) for r in rule_list if "record" in r}


def panel_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def variable_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]


def unknown_names(expr: str, families: dict[str, Family], records: dict[str, set[str]]) -> list[str]:
    """Series and labels the expression uses that neither the router nor the rules produce."""
    problems: list[str] = []
    available: set[str] = set(TARGET_LABELS)
    for sel in selectors(expr):
        if sel.name in families:
            labels = families[sel.name].labels | TARGET_LABELS
        elif sel.name in records:
            labels = records[sel.name] | TARGET_LABELS
        elif sel.name in SYNTHETIC:
            labels = set(TARGET_LABELS)
        else:
            problems.append(f"unknown series {sel.name}")
            continue
        problems += [f"{sel.name} has no label {label!r}" for label in sel.labels - labels]
        available |= labels
    problems += [f"grouping by unknown label {label!r}" for label in grouping_labels(expr) - available]
    return problems


def test_registry_lists_every_family(families: dict[str, Family]) -> None:
    assert families["lane_router_requests_total"].labels == {"class", "lane", "pool", "status"}
    assert "lane_router_time_to_first_token_seconds_bucket" in families
    assert "lane_router_backend_up" in families
    assert "lane_router_requests" not in families  # counters are stored with _total


def test_alert_rules_use_only_real_metrics(families: dict[str, Family]) -> None:
    rule_list = rules()
    records = recorded(rule_list)
    problems = {r.get("alert") or r["record"]: unknown_names(r["expr"], families, records) for r in rule_list}

    assert {name: found for name, found in problems.items() if found} == {}
    alerts = {r["alert"] for r in rule_list if "alert" in r}
    assert alerts >= {"LaneRouterBackendDown", "LaneRouterLaneShedding", "LaneRouterTTFTBudgetBurnFast"}
    assert "LaneRouterTTFTBudgetBurnSlow" in alerts
    assert "LaneRouterSloAttainmentLow" in alerts


def test_dashboard_uses_only_real_metrics(families: dict[str, Family]) -> None:
    records = recorded(rules())
    problems = {expr: unknown_names(expr, families, records) for expr in panel_queries()}
    for query in variable_queries():
        metric = re.fullmatch(r"label_values\((\w+), (\w+)\)", query)
        assert metric is not None, query
        problems[query] = (
            [] if metric[2] in families[metric[1]].labels else [f"{metric[1]} has no {metric[2]}"]
        )

    assert {expr: found for expr, found in problems.items() if found} == {}


def test_the_name_check_can_fail(families: dict[str, Family]) -> None:
    expr = (
        'sum by (tenant) (rate(lane_router_request_total{lane="chat"}[5m]))'
        ' + lane_router_in_flight{class="x"}'
    )

    assert unknown_names(expr, families, {}) == [
        "unknown series lane_router_request_total",
        "lane_router_in_flight has no label 'class'",
        "grouping by unknown label 'tenant'",
    ]


def test_dashboard_covers_what_operators_watch() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    joined = "\n".join(panel_queries())
    ids = [p["id"] for p in dashboard["panels"]]

    assert len(ids) == len(set(ids))
    for metric in (
        "lane_router_time_to_first_token_seconds_bucket", "lane_router_inter_token_latency_seconds_bucket",
        "lane_router_queue_time_seconds_bucket", "lane_router_backend_up", "lane_router_slow_clients_total",
        "lane_router_prefix_affinity_hits_total", "lane_router_requests_total",
        "lane:lane_router_slo_attainment:ratio_rate5m", "lane_router_slo_missed_total",
    ):  # fmt: skip
        assert metric in joined
    assert "sum by (class, le)" in joined  # latency per class


def check_config(promtool: str, path: Path) -> subprocess.CompletedProcess[str]:
    # --syntax-only: the bearer-token file exists only where Prometheus runs.
    return run(promtool, "check", "config", "--syntax-only", str(path))


def without_kubernetes_discovery(path: Path, folder: Path) -> Path:
    """The config with each job's Kubernetes discovery replaced by a static target, for a promtool
    built without Kubernetes discovery (Debian's): everything else in the file is still checked."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    for job in data["scrape_configs"]:
        if job.pop("kubernetes_sd_configs", None) is not None:
            job["static_configs"] = [{"targets": ["pod.example:8000"]}]
    copy = folder / f"static-{path.name}"
    copy.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return copy


@pytest.mark.parametrize("name", ["prometheus.yml", "prometheus-k8s.yml"])
def test_prometheus_configs_pass_promtool(promtool: str, name: str, tmp_path: Path) -> None:
    done = check_config(promtool, PROMETHEUS / name)
    if "field kubernetes_sd_configs not found" in done.stdout + done.stderr:
        done = check_config(promtool, without_kubernetes_discovery(PROMETHEUS / name, tmp_path))

    assert done.returncode == 0, done.stdout + done.stderr


def test_the_config_check_can_fail(promtool: str, tmp_path: Path) -> None:
    data = yaml.safe_load((PROMETHEUS / "prometheus-k8s.yml").read_text(encoding="utf-8"))
    data["scrape_configs"][-1]["relabel_configs"][0]["action"] = "kept"
    broken = tmp_path / "broken.yml"
    broken.write_text(yaml.safe_dump(data), encoding="utf-8")

    done = check_config(promtool, without_kubernetes_discovery(broken, tmp_path))

    assert done.returncode != 0 and "kept" in done.stdout + done.stderr


def test_alert_rules_pass_promtool(promtool: str) -> None:
    done = run(promtool, "check", "rules", str(PROMETHEUS / "alerts.yml"))

    assert done.returncode == 0, done.stdout + done.stderr


def test_alert_rules_behave_as_their_unit_tests_say(promtool: str) -> None:
    done = run(promtool, "test", "rules", str(PROMETHEUS / "tests" / "alerts_test.yml"))

    assert done.returncode == 0, done.stdout + done.stderr


def _prometheus_text(expr: str) -> str:
    for var, value in _GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    return re.sub(r"\$\w+", ".*", expr)


def test_dashboard_queries_parse_as_promql(promtool: str, tmp_path: Path) -> None:
    done = check_promql(promtool, [_prometheus_text(q) for q in panel_queries()], tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr


def test_the_promql_check_can_fail(promtool: str, tmp_path: Path) -> None:
    done = check_promql(promtool, ["sum by (lane (rate(lane_router_requests_total[5m]))"], tmp_path)

    assert done.returncode != 0
