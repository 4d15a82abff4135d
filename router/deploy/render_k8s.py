"""Kubernetes objects for a profile: the router (Deployment, Service, PodDisruptionBudget,
HorizontalPodAutoscaler, the profile in a ConfigMap, keys in a Secret) and each vLLM pool.

A pool is a StatefulSet behind a headless Service, one pod per backend of the profile. The router
balances per backend — least outstanding, power of two on each server's load, rendezvous prefix
affinity, per-backend partial-prefill admission and health — so it must address every replica:
a ClusterIP Service would collapse a pool into one opaque backend and balance per connection,
defeating all of it. The StatefulSet gives each pod a stable name
(`vllm-<pool>-<i>.vllm-<pool>`), and the profile in the ConfigMap lists those names as the
pool's backends. Scaling a pool means changing its number of backends and rendering again: the
StatefulSet's replicas and the profile change together.

A NetworkPolicy admits only the router's pods to the pools, so vLLM's routes that its own
`--api-key` leaves open (`/invocations`, `/tokenize`, …) are unreachable at the network level too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from router import __version__
from router.config.models import ProfileConfig
from router.config.render import RenderError
from router.deploy.plan import (
    CPU_ENTRYPOINT,
    CPU_IMAGE,
    GPU_ENTRYPOINT,
    GPU_IMAGE,
    PROFILE_DIR,
    PROFILE_PATH,
    ROUTER_PORT,
    VLLM_PORT,
    Device,
    Manifest,
    PoolPlan,
    deployed_profile,
    deploys_redis,
    image_for,
    key_hash_envs,
    plan_pools,
    pool_notes,
    router_secret_envs,
    state_notes,
)
from router.deploy.render_state import REDIS, REDIS_POLICY, ingress_only_from, redis_k8s, redis_url
from router.deploy.yamltext import dump
from router.keyhygiene import KEY_HASH_PLACEHOLDER

ROUTER = "lane-router"
ROUTER_PODS = "lane-router-pods"  # headless: one DNS record per router pod, for Prometheus DNS SD
SECRET = "lane-router-secrets"
PROFILE_MAP = "lane-router-profile"
NETWORK_POLICY = "vllm-pools-from-router-only"
POOL_LABEL = "lane-router/pool"
PART_OF = {"app.kubernetes.io/part-of": ROUTER}
ROUTER_SELECTOR = {"app.kubernetes.io/name": ROUTER, "app.kubernetes.io/component": "router"}
POOLS_SELECTOR = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/part-of": ROUTER}
_DROP_ALL = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
_APP_UID = 10001  # the non-root user of the router's and the CPU pool's images


@dataclass(frozen=True, slots=True)
class K8sOptions:
    device: Device = "gpu"
    router_image: str = f"lane-router:{__version__}"
    vllm_image: str | None = None  # "{version}" is replaced by the pool's vLLM version
    router_replicas: int = 2
    router_max_replicas: int = 10
    cache_size: str = "64Gi"
    cpu_kv_cache_gib: int = 4


def pool_backends(plan: PoolPlan) -> list[str]:
    return [f"http://{plan.instance(i)}.{plan.slug}:{VLLM_PORT}" for i in range(plan.replicas)]


def render_k8s(cfg: ProfileConfig, opts: K8sOptions = K8sOptions()) -> Manifest:
    if opts.router_replicas < 2 or opts.router_max_replicas < opts.router_replicas:
        raise RenderError("the router runs at least 2 replicas, and max replicas ≥ replicas")
    plans = plan_pools(cfg, opts.device)
    backends = {p.name: pool_backends(p) for p in plans}
    profile = deployed_profile(cfg, plans, backends, redis_url())
    docs: list[dict[str, Any]] = [
        _secret(cfg, plans),
        _profile_map(profile),
        _router_deployment(cfg, plans, opts),
        _router_service(),
        _router_pods_service(),
        _disruption_budget(),
        _autoscaler(opts),
    ]
    for p in plans:
        docs += [_pool_service(p), _pool_statefulset(p, opts)]
    docs.append(_network_policy())
    if deploys_redis(cfg):
        docs += redis_k8s(_meta, ROUTER_SELECTOR)
    return Manifest(tuple(docs), tuple(_notes(cfg, plans, opts)))


def _meta(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "labels": {**labels, **PART_OF}}


def _secret(cfg: ProfileConfig, plans: tuple[PoolPlan, ...]) -> dict[str, Any]:
    hashes = set(key_hash_envs(cfg))
    values = {name: _placeholder(name, hashes, cfg) for name in router_secret_envs(cfg, plans)}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(SECRET, ROUTER_SELECTOR),
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
        "# Rendered by `lane-router render k8s`: each pool's backends are the pods of its\n"
        "# StatefulSet, addressed through its headless Service (<pod>.<service>).\n"
    )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(PROFILE_MAP, ROUTER_SELECTOR),
        "data": {"profile.yaml": header + dump(profile)},
    }


def _secret_env(name: str, as_name: str | None = None) -> dict[str, Any]:
    return {"name": as_name or name, "valueFrom": {"secretKeyRef": {"name": SECRET, "key": name}}}


def _http_probe(path: str, period: int, failures: int, timeout: int = 2) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _router_deployment(cfg: ProfileConfig, plans: tuple[PoolPlan, ...], opts: K8sOptions) -> dict[str, Any]:
    env = [
        {"name": "LANE_ROUTER_CONFIG", "value": PROFILE_PATH},
        {"name": "LANE_ROUTER_HOST", "value": "0.0.0.0"},
        {"name": "LANE_ROUTER_PORT", "value": str(ROUTER_PORT)},
    ] + [_secret_env(name) for name in router_secret_envs(cfg, plans)]
    container = {
        "name": "router",
        "image": opts.router_image,
        "env": env,
        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}],
        "livenessProbe": _http_probe("/health", 10, 3),
        "readinessProbe": _http_probe("/ready", 5, 2),
        # Endpoints are removed asynchronously: keep serving briefly so no new request is refused.
        "lifecycle": {"preStop": {"exec": {"command": ["python", "-c", "import time; time.sleep(5)"]}}},
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": {**_DROP_ALL, "readOnlyRootFilesystem": True},
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
            "securityContext": _pod_security(non_root=True),
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
        "metadata": _meta(ROUTER, ROUTER_SELECTOR),
        "spec": {
            "replicas": opts.router_replicas,
            "selector": {"matchLabels": ROUTER_SELECTOR},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": pod,
        },
    }


def _pod_security(*, non_root: bool) -> dict[str, Any]:
    ctx: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if non_root:
        ctx |= {"runAsNonRoot": True, "runAsUser": _APP_UID, "runAsGroup": _APP_UID, "fsGroup": _APP_UID}
    return ctx


def _router_service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(ROUTER, ROUTER_SELECTOR),
        "spec": {
            "type": "ClusterIP",
            "selector": ROUTER_SELECTOR,
            "ports": [{"name": "http", "port": ROUTER_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def _router_pods_service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(ROUTER_PODS, ROUTER_SELECTOR),
        "spec": {
            "clusterIP": "None",
            # An unready router still has metrics worth scraping (why it is not ready, for one).
            "publishNotReadyAddresses": True,
            "selector": ROUTER_SELECTOR,
            "ports": [{"name": "http", "port": ROUTER_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def _disruption_budget() -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(ROUTER, ROUTER_SELECTOR),
        "spec": {"minAvailable": 1, "selector": {"matchLabels": ROUTER_SELECTOR}},
    }


def _autoscaler(opts: K8sOptions) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _meta(ROUTER, ROUTER_SELECTOR),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": ROUTER},
            "minReplicas": opts.router_replicas,
            "maxReplicas": opts.router_max_replicas,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}},
                }
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
        },
    }


def _pool_labels(p: PoolPlan) -> dict[str, str]:
    return {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/component": "pool", POOL_LABEL: p.slug}


def _pool_selector(p: PoolPlan) -> dict[str, str]:
    return {"app.kubernetes.io/name": "vllm", POOL_LABEL: p.slug}


def _pool_service(p: PoolPlan) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(p.slug, _pool_labels(p)),
        "spec": {
            "clusterIP": "None",
            # The router probes every backend itself; its names must resolve before vLLM is ready.
            "publishNotReadyAddresses": True,
            "selector": _pool_selector(p),
            "ports": [{"name": "http", "port": VLLM_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def _pool_statefulset(p: PoolPlan, opts: K8sOptions) -> dict[str, Any]:
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
        env.append(_secret_env(p.key_env, "VLLM_API_KEY"))
    if cpu:
        env.append({"name": "VLLM_CPU_KVCACHE_SPACE", "value": str(opts.cpu_kv_cache_gib)})
    model = f"$({p.model_env})"  # expanded by Kubernetes from the container's env
    container = {
        "name": "vllm",
        "image": image_for(template, p.version),
        "command": list(CPU_ENTRYPOINT if cpu else GPU_ENTRYPOINT),
        "args": p.server_args(model, opts.device),
        "env": env,
        "ports": [{"name": "http", "containerPort": VLLM_PORT, "protocol": "TCP"}],
        # Weights download and load before /health answers: up to 30 minutes.
        "startupProbe": _http_probe("/health", 10, 180, timeout=5),
        "livenessProbe": _http_probe("/health", 15, 4, timeout=10),
        "readinessProbe": _http_probe("/health", 5, 2, timeout=5),
        "resources": _pool_resources(p, cpu),
        "securityContext": _DROP_ALL,
        "volumeMounts": [{"name": "cache", "mountPath": "/cache"}, {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(p.slug, _pool_labels(p)),
        "spec": {
            "serviceName": p.slug,
            "replicas": p.replicas,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": _pool_selector(p)},
            "template": {
                "metadata": {"labels": {**_pool_labels(p), **PART_OF}},
                "spec": {
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 60,
                    # The official GPU image runs as root; the CPU image has its own user.
                    "securityContext": _pod_security(non_root=cpu),
                    "containers": [container],
                    "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}],
                },
            },
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "cache"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": opts.cache_size}},
                    },
                }
            ],
        },
    }


def _pool_resources(p: PoolPlan, cpu: bool) -> dict[str, Any]:
    if cpu:
        return {"requests": {"cpu": "8", "memory": "32Gi"}, "limits": {"memory": "48Gi"}}
    return {
        "requests": {"cpu": "4", "memory": "32Gi"},
        "limits": {"memory": "64Gi", "nvidia.com/gpu": str(p.accelerators)},
    }


def _network_policy() -> dict[str, Any]:
    metadata = _meta(NETWORK_POLICY, {"app.kubernetes.io/name": "vllm"})
    return ingress_only_from(metadata, POOLS_SELECTOR, ROUTER_SELECTOR, VLLM_PORT)


def _notes(cfg: ProfileConfig, plans: tuple[PoolPlan, ...], opts: K8sOptions) -> list[str]:
    return [
        f"lane-router Kubernetes manifests for profile {cfg.profile!r} ({opts.device}).",
        f"Apply into one namespace (kubectl apply -n NAMESPACE -f FILE) after filling in the Secret "
        f"{SECRET!r}: the router refuses its key-hash placeholders, and its upstream-key placeholders "
        "are not secret.",
        "Each vLLM pool is a StatefulSet behind a headless Service, one pod per backend of the profile; "
        "the profile in the ConfigMap lists the pods by name (vllm-<pool>-<i>.vllm-<pool>), so the router "
        "balances, admits and health-checks every replica itself. To scale a pool, change its number of "
        "backends in the profile and render again.",
        f"NetworkPolicy {NETWORK_POLICY!r} admits only router pods to the pools (it needs a CNI that "
        "enforces NetworkPolicy); vLLM's own /metrics is therefore not scraped directly.",
        *state_notes(cfg, REDIS, REDIS_POLICY),
        f"Prometheus finds every router pod through the headless Service {ROUTER_PODS!r} "
        "(deploy/prometheus/prometheus-k8s.yml).",
        f"ConfigMap {PROFILE_MAP!r} is mounted as a directory, so edits reach the routers without a restart.",
        *pool_notes(plans),
    ]
