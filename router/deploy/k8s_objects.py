"""Names, labels and small object parts that the Kubernetes renderings share (router/deploy/k8s_*.py,
render_k8s.py): one place for the labels that Services, NetworkPolicies and autoscalers select by."""

from __future__ import annotations

from typing import Any

from router.deploy.plan import PoolPlan

ROUTER = "lane-router"
SECRET = "lane-router-secrets"
POOL_LABEL = "lane-router/pool"
PART_OF = {"app.kubernetes.io/part-of": ROUTER}
ROUTER_SELECTOR = {"app.kubernetes.io/name": ROUTER, "app.kubernetes.io/component": "router"}
POOLS_SELECTOR = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/part-of": ROUTER}
DROP_ALL = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
APP_UID = 10001  # the non-root user of the router's and the CPU pool's images


def meta(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "labels": {**labels, **PART_OF}}


def in_namespace(doc: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The object placed in `namespace`: the pools' DNS names in the profile name it, so the
    objects must not land anywhere else (`kubectl apply -n OTHER` refuses them)."""
    metadata = {"name": doc["metadata"]["name"], "namespace": namespace, **doc["metadata"]}
    return {**doc, "metadata": metadata}


def pool_labels(p: PoolPlan) -> dict[str, str]:
    return {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/component": "pool", POOL_LABEL: p.slug}


def pool_selector(p: PoolPlan) -> dict[str, str]:
    return {"app.kubernetes.io/name": "vllm", POOL_LABEL: p.slug}


def http_probe(path: str, period: int, failures: int, timeout: int = 2) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def secret_env(name: str, as_name: str | None = None) -> dict[str, Any]:
    return {"name": as_name or name, "valueFrom": {"secretKeyRef": {"name": SECRET, "key": name}}}


def pod_security(*, non_root: bool) -> dict[str, Any]:
    ctx: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if non_root:
        ctx |= {"runAsNonRoot": True, "runAsUser": APP_UID, "runAsGroup": APP_UID, "fsGroup": APP_UID}
    return ctx


def scale_target(name: str) -> dict[str, str]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
