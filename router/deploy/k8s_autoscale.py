"""A pool's autoscaler (`lane-router render k8s --autoscale`): an `autoscaling/v2`
HorizontalPodAutoscaler or a KEDA `ScaledObject`, both on the requests waiting in vLLM's own
queue (`vllm:num_requests_waiting`), which grows exactly when the pool's servers have no room:
every running sequence slot or KV block is taken.

With `--autoscale-on slo` (or `both`) a KEDA ScaledObject also, or instead, scales on its lanes'
SLO attainment: the recording rule `lane:lane_router_slo_attainment:ratio_rate5m`
(deploy/prometheus/alerts.yml) of the routers' own counters. Its trigger reads the share of
requests that missed the SLO on the pool's worst lane, against the share the objective allows:
the pool grows in proportion while its lanes miss more than that.

Both need Prometheus to scrape the pool's servers (the `vllm-pools` job of
deploy/prometheus/prometheus-k8s.yml, which labels every series with its namespace, pod and pool).
The HPA reads the metric per pod through a custom-metrics adapter
(deploy/prometheus/prometheus-adapter.yml); KEDA queries Prometheus itself. Since the pools admit
only the router, a second NetworkPolicy opens the autoscaled pools' port to the Prometheus pods.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from router.deploy.k8s_objects import POOL_LABEL, POOLS_SELECTOR, meta, pool_labels, scale_target
from router.deploy.k8s_options import Autoscaler, K8sOptions
from router.deploy.plan import VLLM_PORT, PoolPlan

WAITING_METRIC = "vllm:num_requests_waiting"
# The name the adapter rule serves WAITING_METRIC under (deploy/prometheus/prometheus-adapter.yml).
HPA_METRIC = "vllm_num_requests_waiting"
# The label the `vllm-pools` scrape job copies from the pods' POOL_LABEL.
SCRAPED_POOL_LABEL = "lane_router_pool"
SCRAPE_POLICY = "vllm-metrics-from-prometheus"
KEDA_POLLING_S = 15
# The routers' SLO attainment per lane (deploy/prometheus/alerts.yml), and the share of its
# requests a lane should meet its SLO for: the alert's objective, the lab's gate.
SLO_RECORD = "lane:lane_router_slo_attainment:ratio_rate5m"
SLO_OBJECTIVE = 0.95
# What RE2 reads as syntax in a lane's name (a model's name may hold '.', '+', '/' …).
_RE2_SYNTAX = frozenset("\\.+*?()|[]{}^$")

# A server takes minutes to load its model and is costly to run: add at most two a minute, and
# remove one at a time only after the queue has stayed short for ten minutes.
BEHAVIOR = {
    "scaleUp": {
        "stabilizationWindowSeconds": 0,
        "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}],
    },
    "scaleDown": {
        "stabilizationWindowSeconds": 600,
        "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}],
    },
}


def autoscaler_object(
    p: PoolPlan, a: Autoscaler, opts: K8sOptions, lanes: Sequence[str] = ()
) -> dict[str, Any]:
    """`lanes`: the names of the pool's lanes with an SLO, for `--autoscale-on slo|both`."""
    return _hpa(p, a) if a.kind == "hpa" else _scaled_object(p, a, opts, lanes)


def waiting_query(p: PoolPlan, opts: K8sOptions) -> str:
    """The requests waiting on all the pool's servers (engines and data-parallel ranks summed)."""
    selector = f'namespace="{opts.namespace}",{SCRAPED_POOL_LABEL}="{p.slug}"'
    return f"sum({WAITING_METRIC}{{{selector}}})"


def slo_query(lanes: Sequence[str]) -> str:
    """The share of requests that missed their SLO on the worst of `lanes` over 5 min; 0 while
    none of them judged a request (no traffic is no reason to grow)."""
    names = "|".join("".join(f"\\\\{c}" if c in _RE2_SYNTAX else c for c in lane) for lane in lanes)
    return f'(1 - min({SLO_RECORD}{{lane=~"{names}"}})) or vector(0)'


def _number(value: float) -> str:
    return f"{value:g}"


def _hpa(p: PoolPlan, a: Autoscaler) -> dict[str, Any]:
    target = {"type": "AverageValue", "averageValue": _number(a.waiting)}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": meta(p.slug, pool_labels(p)),
        "spec": {
            "scaleTargetRef": scale_target(p.slug),
            "minReplicas": a.min_replicas,
            "maxReplicas": a.max_replicas,
            "metrics": [{"type": "Pods", "pods": {"metric": {"name": HPA_METRIC}, "target": target}}],
            "behavior": BEHAVIOR,
        },
    }


def _scaled_object(p: PoolPlan, a: Autoscaler, opts: K8sOptions, lanes: Sequence[str]) -> dict[str, Any]:
    triggers = []
    if opts.autoscale_on != "slo":
        triggers.append(_waiting_trigger(p, a, opts))
    if opts.autoscale_on != "waiting":
        triggers.append(_slo_trigger(lanes, opts))
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": meta(p.slug, pool_labels(p)),
        "spec": {
            "scaleTargetRef": scale_target(p.slug),
            "pollingInterval": KEDA_POLLING_S,
            "minReplicaCount": a.min_replicas,
            "maxReplicaCount": a.max_replicas,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": BEHAVIOR}},
            "triggers": triggers,
        },
    }


def _slo_trigger(lanes: Sequence[str], opts: K8sOptions) -> dict[str, Any]:
    return {
        "type": "prometheus",
        # The pool's size times the missed share over the allowed one: 10 % missed where 5 % is
        # allowed asks for twice the servers; a pool meeting its objective asks for fewer.
        "metricType": "Value",
        "metadata": {
            "serverAddress": opts.prometheus_url,
            "query": slo_query(lanes),
            "threshold": _number(round(1 - SLO_OBJECTIVE, 6)),
            "ignoreNullValues": "false",
        },
    }


def _waiting_trigger(p: PoolPlan, a: Autoscaler, opts: K8sOptions) -> dict[str, Any]:
    return {
        "type": "prometheus",
        # The sum divided by the servers running: the same per-server target as the HPA's.
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": opts.prometheus_url,
            "query": waiting_query(p, opts),
            "threshold": _number(a.waiting),
            # A query that finds no series is an error, not zero: a lost scrape must not shrink the pool.
            "ignoreNullValues": "false",
        },
    }


def scrape_policy(scaled: Sequence[PoolPlan], opts: K8sOptions) -> dict[str, Any]:
    """Prometheus's pods may reach the autoscaled pools' servers. A NetworkPolicy opens a port,
    not a path: those pods can reach vLLM's other unauthenticated routes too."""
    source = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": opts.scraper.namespace}},
        "podSelector": {"matchLabels": dict(opts.scraper.labels)},
    }
    pools = {"key": POOL_LABEL, "operator": "In", "values": [p.slug for p in scaled]}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta(SCRAPE_POLICY, {"app.kubernetes.io/name": "vllm"}),
        "spec": {
            "podSelector": {"matchLabels": POOLS_SELECTOR, "matchExpressions": [pools]},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [source], "ports": [{"protocol": "TCP", "port": VLLM_PORT}]}],
        },
    }
