"""A vLLM pool on Kubernetes: a Deployment behind a headless Service, found by the router through
DNS discovery (`PoolConfig.discovery`, router/config/models.py).

The router balances per backend — least outstanding, power of two on each server's load,
rendezvous prefix affinity, per-backend partial-prefill admission and health — so it must address
every replica: a ClusterIP Service would collapse a pool into one opaque backend and balance per
connection. A headless Service without `publishNotReadyAddresses` has one DNS record per *ready*
pod, so its name lists exactly the servers that answer `/health`; the router re-resolves it every
`interval_s`, sends to new servers once they are healthy and drains the ones that left. Scaling
the Deployment (`kubectl scale`, an autoscaler) is all it takes to grow or shrink the pool.

A NetworkPolicy admits only the router's pods to the pools, so vLLM's routes that its own
`--api-key` leaves open (`/invocations`, `/tokenize`, …) are unreachable at the network level too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from router.config.models import DiscoveryConfig
from router.deploy.k8s_objects import (
    DROP_ALL,
    PART_OF,
    POOLS_SELECTOR,
    ROUTER_SELECTOR,
    http_probe,
    meta,
    pod_security,
    pool_labels,
    pool_selector,
    secret_env,
)
from router.deploy.k8s_options import DEFAULT_MAX_BACKENDS, K8sOptions
from router.deploy.plan import (
    CPU_ENTRYPOINT,
    CPU_IMAGE,
    GPU_ENTRYPOINT,
    GPU_IMAGE,
    VLLM_PORT,
    PoolPlan,
    image_for,
)
from router.deploy.render_state import ingress_only_from

NETWORK_POLICY = "vllm-pools-from-router-only"
DISCOVERY_INTERVAL_S = 5.0
# CoreDNS's kubernetes plugin answers with a 5 s TTL: a server that left may still be named that
# long after its endpoint is gone, on top of the router's own re-resolution interval.
_DNS_TTL_S = 5
_ENDPOINT_LAG_S = 5


def pool_dns(p: PoolPlan, opts: K8sOptions) -> str:
    return f"{p.slug}.{opts.namespace}.svc.{opts.cluster_domain}"


def discovery_source(p: PoolPlan, opts: K8sOptions) -> dict[str, Any]:
    """The pool's `discovery:` block in the deployed profile: the pool's headless Service. A
    profile's own discovery keeps its interval and cap; a listed pool gets a cap that admits
    its autoscaler's maximum."""
    own = p.pool.discovery
    block: dict[str, Any] = {"dns": pool_dns(p, opts), "port": VLLM_PORT, "interval_s": _interval(own)}
    scaler = opts.autoscaler(p.name)
    if own is not None and own.max_backends != DEFAULT_MAX_BACKENDS:
        block["max_backends"] = own.max_backends
    elif own is None and scaler is not None and scaler.max_replicas > DEFAULT_MAX_BACKENDS:
        block["max_backends"] = scaler.max_replicas
    return {"discovery": block}


def _interval(own: DiscoveryConfig | None) -> float | int:
    value = DISCOVERY_INTERVAL_S if own is None else own.interval_s
    return int(value) if value == int(value) else value


def fixed_replicas(p: PoolPlan, opts: K8sOptions) -> int | None:
    """The Deployment's replicas when the profile fixes the pool's size; none (left to `kubectl
    scale` or the autoscaler, which `kubectl apply` then never resets) otherwise."""
    if opts.autoscaler(p.name) is not None or p.replicas == 0:
        return None
    return p.replicas


def pool_objects(p: PoolPlan, opts: K8sOptions) -> list[dict[str, Any]]:
    return [_service(p), _deployment(p, opts)]


def _service(p: PoolPlan) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(p.slug, pool_labels(p)),
        "spec": {
            "clusterIP": "None",
            # Only ready servers are named: the router's discovery sees a server once it answers.
            "publishNotReadyAddresses": False,
            "selector": pool_selector(p),
            "ports": [
                {"name": "http", "port": VLLM_PORT, "targetPort": "http", "protocol": "TCP"},
                *({"name": n, "port": port, "targetPort": n, "protocol": "TCP"} for n, port in _kv_ports(p)),
            ],
        },
    }


def _deployment(p: PoolPlan, opts: K8sOptions) -> dict[str, Any]:
    cpu = opts.device == "cpu"
    drain_s = math.ceil(_interval(p.pool.discovery)) + _DNS_TTL_S + _ENDPOINT_LAG_S
    spec: dict[str, Any] = {}
    replicas = fixed_replicas(p, opts)
    if replicas is not None:
        spec["replicas"] = replicas
    spec |= {
        "selector": {"matchLabels": pool_selector(p)},
        # Never below the pool's size while rolling; a surge pod that finds no free accelerator
        # stalls the rollout, not the service.
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
        "template": {
            "metadata": {"labels": {**pool_labels(p), **PART_OF}},
            "spec": {
                "automountServiceAccountToken": False,
                # The drain wait, then a non-streamed request's whole generation, which the
                # profile bounds by response_head_timeout_s.
                "terminationGracePeriodSeconds": drain_s + math.ceil(p.pool.response_head_timeout_s),
                # The official GPU image runs as root; the CPU image has its own user.
                "securityContext": pod_security(non_root=cpu),
                "containers": [_container(p, opts, drain_s)],
                "volumes": [
                    {"name": "cache", "emptyDir": {"sizeLimit": opts.cache_size}},
                    {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
                ],
            },
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(p.slug, pool_labels(p)),
        "spec": spec,
    }


def _container(p: PoolPlan, opts: K8sOptions, drain_s: int) -> dict[str, Any]:
    cpu = opts.device == "cpu"
    template = opts.vllm_image or (CPU_IMAGE if cpu else GPU_IMAGE)
    env: list[dict[str, Any]] = [
        {"name": p.model_env, "value": p.pool.model},
        {"name": "HF_HOME", "value": "/cache/hf"},
        {"name": "VLLM_CACHE_ROOT", "value": "/cache/vllm"},
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
        {"name": "DO_NOT_TRACK", "value": "1"},
    ]
    if p.key_env is not None:
        env.append(secret_env(p.key_env, "VLLM_API_KEY"))
    if cpu:
        env.append({"name": "VLLM_CPU_KVCACHE_SPACE", "value": str(opts.cpu_kv_cache_gib)})
    return {
        "name": "vllm",
        "image": image_for(template, p.version),
        "command": list(CPU_ENTRYPOINT if cpu else GPU_ENTRYPOINT),
        "args": p.server_args(f"$({p.model_env})", opts.device),  # Kubernetes expands $(VAR) from env
        "env": env,
        "ports": [
            {"name": "http", "containerPort": VLLM_PORT, "protocol": "TCP"},
            *({"name": n, "containerPort": port, "protocol": "TCP"} for n, port in _kv_ports(p)),
        ],
        # Weights download and load before /health answers: up to 30 minutes.
        "startupProbe": http_probe("/health", 10, 180, timeout=5),
        "livenessProbe": http_probe("/health", 15, 4, timeout=10),
        "readinessProbe": http_probe("/health", 5, 2, timeout=5),
        # Keep serving until every router has stopped choosing this server (its DNS record is gone
        # and re-resolved), so no new request meets a closed port.
        "lifecycle": {"preStop": {"sleep": {"seconds": drain_s}}},
        "resources": _resources(p, cpu),
        "securityContext": DROP_ALL,
        "volumeMounts": [{"name": "cache", "mountPath": "/cache"}, {"name": "dshm", "mountPath": "/dev/shm"}],
    }


def _resources(p: PoolPlan, cpu: bool) -> dict[str, Any]:
    if cpu:
        return {"requests": {"cpu": "8", "memory": "32Gi"}, "limits": {"memory": "48Gi"}}
    return {
        "requests": {"cpu": "4", "memory": "32Gi"},
        "limits": {"memory": "64Gi", "nvidia.com/gpu": str(p.accelerators)},
    }


def pools_policy(plans: Iterable[PoolPlan]) -> dict[str, Any]:
    """The router reaches the servers' HTTP port, and the KV event publishers it follows."""
    metadata = meta(NETWORK_POLICY, {"app.kubernetes.io/name": "vllm"})
    kv = sorted({n for p in plans if p.kv is not None for n in p.kv.all()})
    return ingress_only_from(metadata, POOLS_SELECTOR, ROUTER_SELECTOR, VLLM_PORT, *kv)


def _kv_ports(p: PoolPlan) -> list[tuple[str, int]]:
    # The router subscribes to every pod's publishers at the pod IPs the headless Service names.
    if p.kv is None:
        return []
    names = [f"kv{i}" for i in range(p.kv.ranks)]
    out = [(name, p.kv.port + i) for i, name in enumerate(names)]
    if p.kv.replay_port is not None:
        out += [(f"kvr{i}", p.kv.replay_port + i) for i in range(p.kv.ranks)]
    return out
