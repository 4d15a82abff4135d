"""The pools' autoscalers: an HPA on the Pods metric the adapter rule serves, or a KEDA
ScaledObject querying Prometheus, both on the requests waiting in vLLM's queue; the HPA checked
against the Kubernetes schemas, the ScaledObject against tests/deploy/keda-scaledobject.schema.json,
their queries by promtool, and Prometheus allowed to scrape the autoscaled pools alone."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from router.config import parse_profile
from router.config.models import ProfileConfig
from router.config.render import RenderError
from router.deploy.k8s_autoscale import HPA_METRIC, SCRAPED_POOL_LABEL, SLO_RECORD, WAITING_METRIC, slo_query
from router.deploy.k8s_objects import POOL_LABEL, POOLS_SELECTOR
from router.deploy.k8s_options import K8sOptions, Scraper, parse_autoscaler
from router.deploy.render_k8s import render_k8s
from tests.deploy.k8s import Doc, container, kind, manifests, one, pod_labels, pools, selects_expressions
from tests.deploy.samples import example
from tests.deploy.tools import DEPLOY, K8S_VERSIONS, check_promql, require_tool, run

SCHEMA = Path(__file__).with_name("keda-scaledobject.schema.json")
ADAPTER = DEPLOY / "prometheus" / "prometheus-adapter.yml"
SCRAPE = DEPLOY / "prometheus" / "prometheus-k8s.yml"
SCALED = ("interactive=hpa:2-6", "batch=keda:1-4:8")


@pytest.fixture(scope="module")
def keda() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


@pytest.fixture(scope="module")
def promtool() -> str:
    return require_tool("promtool")


def errors(validator: Any, doc: Doc) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def adapter_rule() -> Doc:
    rules: list[Doc] = yaml.safe_load(ADAPTER.read_text(encoding="utf-8"))["rules"]
    [rule] = rules
    return rule


def test_an_hpa_scales_its_pool_on_the_requests_waiting_per_server() -> None:
    docs = manifests(None, *SCALED)
    hpa = one(docs, "HorizontalPodAutoscaler", "vllm-interactive")
    spec = hpa["spec"]
    [metric] = spec["metrics"]

    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "vllm-interactive",
    }
    assert one(docs, "Deployment", "vllm-interactive")["kind"] == spec["scaleTargetRef"]["kind"]
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 6)
    assert metric == {
        "type": "Pods",
        "pods": {"metric": {"name": HPA_METRIC}, "target": {"type": "AverageValue", "averageValue": "4"}},
    }
    down, up = spec["behavior"]["scaleDown"], spec["behavior"]["scaleUp"]
    assert down["stabilizationWindowSeconds"] > up["stabilizationWindowSeconds"]
    assert [h["metadata"]["name"] for h in kind(docs, "HorizontalPodAutoscaler")] == [
        "lane-router",
        "vllm-interactive",
    ]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_hpa_is_valid_and_its_check_can_fail(version: str) -> None:
    hpa = one(manifests(None, *SCALED), "HorizontalPodAutoscaler", "vllm-interactive")
    kubernetes_validate.validate(hpa, version, strict=True)

    broken = copy.deepcopy(hpa)
    broken["spec"]["metrics"][0]["pods"]["target"]["averageValu"] = "4"
    with pytest.raises(kubernetes_validate.ValidationError, match="averageValu"):
        kubernetes_validate.validate(broken, version, strict=True)


def test_a_scaled_object_sums_the_pools_waiting_requests_in_prometheus(keda: Any) -> None:
    options = {"namespace": "llm", "prometheus_url": "http://prom.watch.svc:9090"}
    scaled = one(manifests(None, *SCALED, **options), "ScaledObject", "vllm-batch")
    spec = scaled["spec"]
    [trigger] = spec["triggers"]

    assert errors(keda, scaled) == []
    assert scaled["metadata"]["namespace"] == "llm"
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm-batch"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 4)
    assert (trigger["type"], trigger["metricType"]) == ("prometheus", "AverageValue")
    assert trigger["metadata"] == {
        "serverAddress": "http://prom.watch.svc:9090",
        "query": f'sum({WAITING_METRIC}{{namespace="llm",{SCRAPED_POOL_LABEL}="vllm-batch"}})',
        "threshold": "8",
        "ignoreNullValues": "false",
    }


@pytest.mark.parametrize(
    ("path", "value", "complaint"),
    [
        (("spec", "minReplicas"), 1, "'minReplicas' was unexpected"),
        (("spec", "triggers", 0, "metadata", "threshold"), 8, "8 is not of type 'string'"),
        (("spec", "triggers", 0, "metadata", "threshold"), "eight", "does not match"),
        (
            ("spec", "triggers", 0, "metadata", "serverAdress"),
            "http://p:9090",
            "'serverAdress' was unexpected",
        ),
        (("spec", "triggers", 0, "metricType"), "Average", "is not one of"),
        (("spec", "scaleTargetRef", "name"), "vllm_batch", "does not match"),
        (("apiVersion",), "keda.sh/v1", "'keda.sh/v1alpha1' was expected"),
    ],
)
def test_the_scaled_object_schema_check_can_fail(
    keda: Any, path: tuple[str | int, ...], value: Any, complaint: str
) -> None:
    scaled = copy.deepcopy(one(manifests(None, *SCALED), "ScaledObject", "vllm-batch"))
    *parents, last = path
    node: Any = scaled
    for key in parents:
        node = node[key]
    node[last] = value

    assert any(complaint in e for e in errors(keda, scaled)), errors(keda, scaled)


def test_a_scaled_object_without_its_query_is_refused(keda: Any) -> None:
    scaled = copy.deepcopy(one(manifests(None, *SCALED), "ScaledObject", "vllm-batch"))
    del scaled["spec"]["triggers"][0]["metadata"]["query"]

    assert any("'query' is a required property" in e for e in errors(keda, scaled))


def test_the_scaled_objects_query_is_promql(promtool: str, tmp_path: Path) -> None:
    scaled = one(manifests(None, *SCALED), "ScaledObject", "vllm-batch")
    [trigger] = scaled["spec"]["triggers"]

    done = check_promql(promtool, [trigger["metadata"]["query"]], tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr


def test_the_adapter_rule_serves_the_metric_the_hpa_reads() -> None:
    rule = adapter_rule()

    assert rule["seriesQuery"].startswith(WAITING_METRIC + "{")
    assert re.fullmatch(rule["name"]["matches"], WAITING_METRIC)
    assert rule["name"]["as"] == HPA_METRIC
    assert rule["resources"]["overrides"] == {
        "namespace": {"resource": "namespace"},
        "pod": {"resource": "pod"},
    }


def test_the_adapter_rules_queries_are_promql(promtool: str, tmp_path: Path) -> None:
    rule = adapter_rule()
    # The adapter fills in its templates before it asks Prometheus; these are values it would use.
    filled = (
        rule["metricsQuery"]
        .replace("<<.Series>>", WAITING_METRIC)
        .replace("<<.LabelMatchers>>", 'namespace="lane-router",pod=~"vllm-a-1|vllm-a-2"')
        .replace("<<.GroupBy>>", "pod")
    )

    done = check_promql(promtool, [rule["seriesQuery"], filled], tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr


def test_prometheus_scrapes_the_pool_pods_with_the_labels_the_autoscalers_select_by() -> None:
    [job] = [
        j
        for j in yaml.safe_load(SCRAPE.read_text(encoding="utf-8"))["scrape_configs"]
        if j["job_name"] == "vllm-pools"
    ]
    [sd] = job["kubernetes_sd_configs"]
    relabelled = {
        r["target_label"]: r["source_labels"] for r in job["relabel_configs"] if "target_label" in r
    }
    [keep] = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    pool = pools(manifests())["interactive"]

    assert sd["role"] == "pod" and sd["namespaces"]["names"] == [K8sOptions().namespace]
    [selector] = sd["selectors"]
    assert dict(pair.split("=") for pair in selector["label"].split(",")) == POOLS_SELECTOR
    assert relabelled["namespace"] == ["__meta_kubernetes_namespace"]
    assert relabelled["pod"] == ["__meta_kubernetes_pod_name"]
    sanitized = re.sub(r"[^a-zA-Z0-9_]", "_", POOL_LABEL)
    assert relabelled[SCRAPED_POOL_LABEL] == [f"__meta_kubernetes_pod_label_{sanitized}"]
    assert pod_labels(pool)[POOL_LABEL] == "vllm-interactive"
    assert [p["name"] for p in container(pool)["ports"]] == [keep["regex"]]


def test_prometheus_may_reach_the_autoscaled_pools_alone() -> None:
    scraper = Scraper("observability", (("app", "prom"),))
    docs = manifests(None, *SCALED, scraper=scraper)
    policy = one(docs, "NetworkPolicy", "vllm-metrics-from-prometheus")["spec"]
    [rule] = policy["ingress"]
    [source] = rule["from"]

    scaled = {
        name for name, d in pools(docs).items() if selects_expressions(policy["podSelector"], pod_labels(d))
    }
    assert scaled == {"interactive", "batch"}
    assert not selects_expressions(policy["podSelector"], pod_labels(one(docs, "Deployment", "lane-router")))
    assert source == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
        "podSelector": {"matchLabels": {"app": "prom"}},
    }
    assert rule["ports"] == [{"protocol": "TCP", "port": 8000}]


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (("chat=hpa:1-2",), "autoscaler for 'chat': the profile has no such pool"),
        (("slow=hpa:1-2", "slow=keda:1-3"), "pool 'slow' has two autoscalers"),
    ],
)
def test_an_autoscaler_must_name_a_pool_once(specs: tuple[str, ...], message: str) -> None:
    options = K8sOptions(autoscalers=tuple(parse_autoscaler(s) for s in specs))

    with pytest.raises(RenderError, match=message):
        render_k8s(example(), options)


def slo_scaled(autoscale_on: str, profile: ProfileConfig | None = None) -> Doc:
    docs = manifests(profile, "interactive=keda:2-6", autoscale_on=autoscale_on)
    return one(docs, "ScaledObject", "vllm-interactive")


def test_a_scaled_object_can_scale_on_its_lanes_slo_attainment(keda: Any) -> None:
    both, slo = slo_scaled("both"), slo_scaled("slo")
    waiting, attainment = both["spec"]["triggers"]
    [alone] = slo["spec"]["triggers"]

    assert errors(keda, both) == [] and errors(keda, slo) == []
    assert waiting["metadata"]["query"].startswith(f"sum({WAITING_METRIC}")
    assert attainment == alone
    assert (attainment["type"], attainment["metricType"]) == ("prometheus", "Value")
    # The example profile's lanes on `interactive`: chat and agent, each with its class's SLO.
    assert attainment["metadata"] == {
        "serverAddress": "http://prometheus.monitoring.svc:9090",
        "query": f'(1 - min({SLO_RECORD}{{lane=~"chat|agent"}})) or vector(0)',
        "threshold": "0.05",
        "ignoreNullValues": "false",
    }
    [only] = slo_scaled("waiting")["spec"]["triggers"]
    assert only == waiting


def test_the_slo_query_reads_the_worst_lanes_missed_share_from_the_recording_rule(
    promtool: str, tmp_path: Path
) -> None:
    """The query against the real recording rule (promtool test rules): the worst of the pool's
    lanes, matched by name exactly (a model's name holds regex syntax), and 0 with no traffic."""
    lanes = ("org/m-1.5:chat", "org/m-1.5:agent")
    series = [
        # chat meets 75 % (3 of 4 requests), agent 98 %; a lane of another pool, whose name
        # the dot would match unescaped, misses everything.
        ('lane_router_slo_met_total{lane="org/m-1.5:chat", class="chat"}', "0+45x20"),
        ('lane_router_slo_missed_total{lane="org/m-1.5:chat", class="chat", missed="itl"}', "0+15x20"),
        ('lane_router_slo_met_total{lane="org/m-1.5:agent", class="agent"}', "0+588x20"),
        ('lane_router_slo_missed_total{lane="org/m-1.5:agent", class="agent", missed="e2e"}', "0+12x20"),
        ('lane_router_slo_missed_total{lane="org/m-1x5:chat", class="chat", missed="ttft"}', "0+60x20"),
    ]
    query = slo_query(lanes)
    tests = {
        "rule_files": [str(DEPLOY / "prometheus" / "alerts.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "promql_expr_test": [
                    {"expr": query, "eval_time": "15m", "exp_samples": [{"labels": "{}", "value": 0.25}]},
                ],
            },
            {
                "interval": "1m",
                "input_series": [{"series": series[0][0], "values": "7x20"}],
                "promql_expr_test": [
                    {"expr": query, "eval_time": "15m", "exp_samples": [{"labels": "{}", "value": 0}]},
                ],
            },
        ],
    }
    path = tmp_path / "slo_query_test.yml"
    path.write_text(yaml.safe_dump(tests), encoding="utf-8")

    done = run(promtool, "test", "rules", str(path))

    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("scaler", "lanes", "message"),
    [
        ("interactive=hpa:2-6", {}, "scaling on SLO attainment .* takes keda"),
        (
            "interactive=keda:2-6",
            {"chat": {"pool": "interactive", "slo": None}, "agent": {"pool": "interactive", "slo": {}}},
            "none of the pool's lanes has an SLO",
        ),
    ],
)
def test_scaling_on_slo_needs_keda_and_a_lane_with_an_slo(scaler: str, lanes: Doc, message: str) -> None:
    data = example().model_dump(mode="json", exclude_unset=True)
    for name, lane in lanes.items():
        data["lanes"][name] = lane
    options = K8sOptions(autoscalers=(parse_autoscaler(scaler),), autoscale_on="slo")

    with pytest.raises(RenderError, match=message):
        render_k8s(parse_profile(data), options)
