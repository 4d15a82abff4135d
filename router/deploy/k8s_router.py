"""The router on Kubernetes: a Deployment of at least two replicas with its Services,
PodDisruptionBudget and CPU autoscaler, the deployed profile in a ConfigMap and every secret it
names in a Secret.

How many routers run is one number, `router_replicas`: the Deployment's `replicas`, the
autoscaler's minimum and the deployed profile's `replicas:` (router/state/slots/budget.py), the
larger of the profile's own `replicas:` and the rendering's minimum. With `state:` the
autoscaler may add routers up to its maximum: their counts are exact in Redis, and only while
Redis is unreachable does each fall back to its part, `limit // replicas`. Without `state:` a
router's part is all it ever enforces, so more routers than the profile says would multiply every
lane and prefill limit: the rendering runs exactly that many and no autoscaler."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from router.config.models import ProfileConfig
from router.deploy.k8s_objects import (
    DROP_ALL,
    PART_OF,
    ROUTER,
    ROUTER_SELECTOR,
    SECRET,
    http_probe,
    meta,
    pod_security,
    scale_target,
    secret_env,
)
from router.deploy.k8s_options import K8sOptions
from router.deploy.plan import (
    PROFILE_DIR,
    PROFILE_PATH,
    ROUTER_PORT,
    PoolPlan,
    key_hash_envs,
    router_secret_envs,
)
from router.deploy.yamltext import dump
from router.keys.hygiene import KEY_HASH_PLACEHOLDER

ROUTER_PODS = "lane-router-pods"  # headless: one DNS record per router pod, for Prometheus DNS SD
PROFILE_MAP = "lane-router-profile"


def router_objects(
    cfg: ProfileConfig, plans: Sequence[PoolPlan], profile: dict[str, Any], opts: K8sOptions
) -> list[dict[str, Any]]:
    docs = [
        _secret(cfg, plans),
        _profile_map(profile),
        _deployment(cfg, plans, opts),
        _service(ROUTER, cluster_ip=True),
        _service(ROUTER_PODS, cluster_ip=False),
        _disruption_budget(),
    ]
    most = router_max_replicas(cfg, opts)
    if most is not None:
        docs.append(_autoscaler(router_replicas(cfg, opts), most))
    return docs


def router_replicas(cfg: ProfileConfig, opts: K8sOptions) -> int:
    """The routers that run: the profile's `replicas:`, or the rendering's minimum if larger."""
    return max(opts.router_replicas, cfg.replicas)


def router_max_replicas(cfg: ProfileConfig, opts: K8sOptions) -> int | None:
    """The most routers the CPU autoscaler runs; none (no autoscaler) without `state:`, where
    each router's part of every limit assumes exactly `router_replicas` of them."""
    if not cfg.state.shared:
        return None
    most = max(opts.router_max_replicas, router_replicas(cfg, opts))
    return most if most > router_replicas(cfg, opts) else None


def _secret(cfg: ProfileConfig, plans: Sequence[PoolPlan]) -> dict[str, Any]:
    hashes = set(key_hash_envs(cfg))
    values = {name: _placeholder(name, hashes, cfg) for name in router_secret_envs(cfg, plans)}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta(SECRET, ROUTER_SELECTOR),
        "type": "Opaque",
        "stringData": values,
    }


def _placeholder(name: str, hashes: set[str], cfg: ProfileConfig) -> str:
    if name in hashes:
        return KEY_HASH_PLACEHOLDER
    if name == cfg.state.redis_url_env:
        return "REPLACE with the shared-state Redis URL (redis://[:password@]host:6379/0)"
    return "REPLACE with a long random string shared by the router and the pool"


def _profile_map(profile: dict[str, Any]) -> dict[str, Any]:
    header = (
        "# Rendered by `lane-router render k8s`: each pool's backends are the ready pods behind its\n"
        "# headless Service, found by DNS discovery and re-resolved every interval_s.\n"
    )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(PROFILE_MAP, ROUTER_SELECTOR),
        "data": {"profile.yaml": header + dump(profile)},
    }


def _deployment(cfg: ProfileConfig, plans: Sequence[PoolPlan], opts: K8sOptions) -> dict[str, Any]:
    env = [
        {"name": "LANE_ROUTER_CONFIG", "value": PROFILE_PATH},
        {"name": "LANE_ROUTER_HOST", "value": "0.0.0.0"},
        {"name": "LANE_ROUTER_PORT", "value": str(ROUTER_PORT)},
    ] + [secret_env(name) for name in router_secret_envs(cfg, plans)]
    container = {
        "name": "router",
        "image": opts.router_image,
        "env": env,
        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}],
        "livenessProbe": http_probe("/health", 10, 3),
        "readinessProbe": http_probe("/ready", 5, 2),
        # Endpoints are removed asynchronously: keep serving briefly so no new request is refused.
        "lifecycle": {"preStop": {"exec": {"command": ["python", "-c", "import time; time.sleep(5)"]}}},
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": {**DROP_ALL, "readOnlyRootFilesystem": True},
        "volumeMounts": [
            {"name": "profile", "mountPath": PROFILE_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    pod = {
        "metadata": {"labels": {**ROUTER_SELECTOR, **PART_OF}},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 45,
            "securityContext": pod_security(non_root=True),
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {"matchLabels": ROUTER_SELECTOR},
                }
            ],
            "containers": [container],
            # A directory mount: kubelet swaps ConfigMap updates in atomically and the router's
            # directory watcher reloads the profile.
            "volumes": [
                {"name": "profile", "configMap": {"name": PROFILE_MAP}},
                {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
            ],
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(ROUTER, ROUTER_SELECTOR),
        "spec": {
            "replicas": router_replicas(cfg, opts),
            "selector": {"matchLabels": ROUTER_SELECTOR},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": pod,
        },
    }


def _service(name: str, *, cluster_ip: bool) -> dict[str, Any]:
    """The router's Service, or (headless) the one naming every router pod."""
    # An unready router still has metrics worth scraping (why it is not ready, for one).
    headless = {"clusterIP": "None", "publishNotReadyAddresses": True}
    spec: dict[str, Any] = {"type": "ClusterIP"} if cluster_ip else headless
    spec |= {
        "selector": ROUTER_SELECTOR,
        "ports": [{"name": "http", "port": ROUTER_PORT, "targetPort": "http", "protocol": "TCP"}],
    }
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta(name, ROUTER_SELECTOR), "spec": spec}


def _disruption_budget() -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta(ROUTER, ROUTER_SELECTOR),
        "spec": {"minAvailable": 1, "selector": {"matchLabels": ROUTER_SELECTOR}},
    }


def _autoscaler(least: int, most: int) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": meta(ROUTER, ROUTER_SELECTOR),
        "spec": {
            "scaleTargetRef": scale_target(ROUTER),
            "minReplicas": least,
            "maxReplicas": most,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}},
                }
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
        },
    }
