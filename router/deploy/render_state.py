"""The Redis that router replicas share their state through (profile `state.redis_url`, see
`router.deploy.plan.deploys_redis`): a compose service on a network of its own with the router,
or a Kubernetes Deployment and Service that a NetworkPolicy opens to router pods alone.

One instance without persistence: every key it holds expires by itself within minutes, and a
restart costs no more than a fresh minute of allowance for each key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from router.deploy.plan import REDIS_ARGS, REDIS_IMAGE, REDIS_PORT

REDIS = "lane-router-redis"
REDIS_POLICY = "redis-from-router-only"
REDIS_SELECTOR = {"app.kubernetes.io/name": "redis", "app.kubernetes.io/component": "state"}
_REDIS_UID = 999  # the `redis` user of the official image
_DROP_ALL = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}

Meta = Callable[[str, dict[str, str]], dict[str, Any]]


def redis_url() -> str:
    return f"redis://{REDIS}:{REDIS_PORT}/0"


def redis_compose() -> dict[str, Any]:
    return {
        "image": REDIS_IMAGE,
        "command": ["redis-server", "--port", str(REDIS_PORT), *REDIS_ARGS],
        "networks": ["state"],
        "read_only": True,
        "tmpfs": ["/data"],
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
        "user": "redis",
        "healthcheck": {
            "test": ["CMD", "redis-cli", "-p", str(REDIS_PORT), "ping"],
            "interval": "10s",
            "timeout": "3s",
            "retries": 3,
        },
        "restart": "unless-stopped",
    }


def redis_k8s(meta: Meta, router_selector: dict[str, str]) -> list[dict[str, Any]]:
    """Deployment, Service and NetworkPolicy; `meta` names and labels an object as the other
    renderings do."""
    return [_deployment(meta), _service(meta), _policy(meta, router_selector)]


def _deployment(meta: Meta) -> dict[str, Any]:
    container = {
        "name": "redis",
        "image": REDIS_IMAGE,
        "command": ["redis-server"],
        "args": ["--port", str(REDIS_PORT), *REDIS_ARGS],
        "ports": [{"name": "redis", "containerPort": REDIS_PORT, "protocol": "TCP"}],
        "livenessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 10, "failureThreshold": 3},
        "readinessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 5, "failureThreshold": 2},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "384Mi"}},
        "securityContext": {**_DROP_ALL, "readOnlyRootFilesystem": True},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    security = {
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsNonRoot": True,
        "runAsUser": _REDIS_UID,
        "runAsGroup": _REDIS_UID,
        "fsGroup": _REDIS_UID,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(REDIS, REDIS_SELECTOR),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": REDIS_SELECTOR},
            # One instance, never two side by side each with counters of its own.
            "strategy": {"type": "Recreate"},
            "template": {
                "metadata": {"labels": meta(REDIS, REDIS_SELECTOR)["labels"]},
                "spec": {
                    "automountServiceAccountToken": False,
                    "securityContext": security,
                    "containers": [container],
                    "volumes": [{"name": "data", "emptyDir": {"sizeLimit": "64Mi"}}],
                },
            },
        },
    }


def _service(meta: Meta) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(REDIS, REDIS_SELECTOR),
        "spec": {
            "type": "ClusterIP",
            "selector": REDIS_SELECTOR,
            "ports": [{"name": "redis", "port": REDIS_PORT, "targetPort": "redis", "protocol": "TCP"}],
        },
    }


def _policy(meta: Meta, router_selector: dict[str, str]) -> dict[str, Any]:
    return ingress_only_from(meta(REDIS_POLICY, REDIS_SELECTOR), REDIS_SELECTOR, router_selector, REDIS_PORT)


def ingress_only_from(
    metadata: dict[str, Any],
    pods: dict[str, str],
    clients: dict[str, str],
    port: int,
    *more_ports: int,
) -> dict[str, Any]:
    """A NetworkPolicy letting only the `clients` pods reach the `pods` pods, on `port` (and
    `more_ports`)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": {
            "podSelector": {"matchLabels": pods},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": clients}}],
                    "ports": [{"protocol": "TCP", "port": n} for n in (port, *more_ports)],
                }
            ],
        },
    }
