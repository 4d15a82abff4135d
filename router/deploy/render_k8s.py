"""Kubernetes objects for a profile: the router (router/deploy/k8s_router.py), each vLLM pool as a
Deployment behind a headless Service that the router finds by DNS discovery
(router/deploy/k8s_pools.py), an optional autoscaler per pool (router/deploy/k8s_autoscale.py),
the NetworkPolicies that keep the pools reachable from the router alone, and the router
replicas' shared Redis (router/deploy/render_state.py).

Every object is placed in one namespace (`K8sOptions.namespace`), because the deployed profile
names the pools by their fully qualified Service names.
"""

from __future__ import annotations

from router.config.models import ProfileConfig
from router.deploy.k8s_autoscale import HPA_METRIC, SCRAPE_POLICY, autoscaler_object, scrape_policy
from router.deploy.k8s_objects import ROUTER_SELECTOR, SECRET, in_namespace, meta
from router.deploy.k8s_options import DEFAULTS, Autoscaler, K8sOptions, check_options, slo_lanes
from router.deploy.k8s_pools import (
    NETWORK_POLICY,
    discovery_source,
    fixed_replicas,
    pool_objects,
    pools_policy,
)
from router.deploy.k8s_router import (
    PROFILE_MAP,
    ROUTER_PODS,
    router_max_replicas,
    router_objects,
    router_replicas,
)
from router.deploy.plan import (
    Manifest,
    PoolPlan,
    deployed_profile,
    deploys_redis,
    plan_pools,
    pool_notes,
    state_notes,
)
from router.deploy.render_state import REDIS, REDIS_POLICY, redis_k8s, redis_url

__all__ = ["K8sOptions", "render_k8s"]


def render_k8s(cfg: ProfileConfig, opts: K8sOptions = DEFAULTS) -> Manifest:
    check_options(cfg, opts)
    plans = plan_pools(cfg, opts.device)
    sources = {p.name: discovery_source(p, opts) for p in plans}
    profile = deployed_profile(cfg, plans, sources, redis_url(), router_replicas(cfg, opts))
    docs = router_objects(cfg, plans, profile, opts)
    scaled: list[PoolPlan] = []
    for p in plans:
        docs += pool_objects(p, opts)
        scaler = opts.autoscaler(p.name)
        if scaler is not None:
            docs.append(autoscaler_object(p, scaler, opts, slo_lanes(cfg, p.name)))
            scaled.append(p)
    docs.append(pools_policy(plans))
    if scaled:
        docs.append(scrape_policy(scaled, opts))
    if deploys_redis(cfg):
        docs += redis_k8s(meta, ROUTER_SELECTOR)
    placed = tuple(in_namespace(doc, opts.namespace) for doc in docs)
    return Manifest(placed, tuple(_notes(cfg, plans, opts)))


def _notes(cfg: ProfileConfig, plans: tuple[PoolPlan, ...], opts: K8sOptions) -> list[str]:
    ns = opts.namespace
    return [
        f"lane-router Kubernetes manifests for profile {cfg.profile!r} ({opts.device}), namespace {ns!r}.",
        f"Apply with `kubectl apply -f FILE` into the existing namespace {ns!r} (the profile names the "
        f"pools by their DNS names in it) after filling in the Secret {SECRET!r}: the router refuses its "
        "key-hash placeholders, and its upstream-key placeholders are not secret.",
        f"Each vLLM pool is a Deployment behind a headless Service that names only its ready pods; the "
        f"profile in the ConfigMap finds every pool by DNS discovery (vllm-<pool>.{ns}.svc."
        f"{opts.cluster_domain}), so the router balances, admits and health-checks each server itself and "
        "follows the pool as it grows or shrinks: new servers get traffic once healthy, leaving ones "
        "drain (preStop waits until the routers stopped choosing them).",
        *_size_notes(plans, opts),
        f"Each pool pod downloads its model into an emptyDir ({opts.cache_size}) when it starts; the "
        "startup probe allows 30 minutes. Mount a shared volume at /cache, or build the weights into the "
        "image, for faster scale-up.",
        f"NetworkPolicy {NETWORK_POLICY!r} admits only router pods to the pools (it needs a CNI that "
        "enforces NetworkPolicy).",
        *_autoscaler_notes(plans, opts),
        *state_notes(cfg, REDIS, REDIS_POLICY),
        _exactness_note(cfg),
        _router_count_note(cfg, opts),
        f"Prometheus finds every router pod through the headless Service {ROUTER_PODS!r} "
        "(deploy/prometheus/prometheus-k8s.yml).",
        f"ConfigMap {PROFILE_MAP!r} is mounted as a directory, so edits reach the routers without a restart.",
        *pool_notes(plans),
    ]


def _size_notes(plans: tuple[PoolPlan, ...], opts: K8sOptions) -> list[str]:
    fixed = [p for p in plans if fixed_replicas(p, opts) is not None]
    free = [p.slug for p in plans if fixed_replicas(p, opts) is None and opts.autoscaler(p.name) is None]
    notes = []
    if fixed:
        notes.append(
            f"{', '.join(p.slug for p in fixed)}: as many servers as the profile lists; `kubectl scale "
            "deployment/NAME` resizes a pool without touching the profile, until this file is applied again."
        )
    if free:
        notes.append(
            f"{', '.join(free)}: the profile fixes no size; they start with one server and keep any count "
            "`kubectl scale` gives them (this file sets none)."
        )
    return notes


def _autoscaler_notes(plans: tuple[PoolPlan, ...], opts: K8sOptions) -> list[str]:
    scalers = [a for p in plans if (a := opts.autoscaler(p.name)) is not None]
    if not scalers:
        return []
    scraper = ", ".join(f"{k}={v}" for k, v in opts.scraper.labels)
    return [
        *(_autoscaler_note(a, opts) for a in scalers),
        "Autoscalers read vllm:num_requests_waiting, which Prometheus scrapes from the pool pods "
        "(job 'vllm-pools' of deploy/prometheus/prometheus-k8s.yml); they leave the Deployments' replicas "
        "to the autoscaler, so applying this file again never resets them.",
        f"NetworkPolicy {SCRAPE_POLICY!r} admits pods labelled {scraper} in namespace "
        f"{opts.scraper.namespace!r} to the autoscaled pools' port: a NetworkPolicy opens a port, not a "
        "path, so those pods reach vLLM's other unauthenticated routes too.",
    ]


def _autoscaler_note(a: Autoscaler, opts: K8sOptions) -> str:
    what = f"pool {a.pool}: {a.min_replicas} to {a.max_replicas} servers, adding servers while they "
    what += f"average more than {a.waiting:g} waiting requests; "
    if a.kind == "hpa":
        return what + (
            f"a HorizontalPodAutoscaler on the Pods metric {HPA_METRIC}, served by a custom-metrics adapter "
            "(the Prometheus adapter's rule: deploy/prometheus/prometheus-adapter.yml)."
        )
    return (
        what + f"a KEDA ScaledObject (KEDA must be installed) querying Prometheus at {opts.prometheus_url}."
    )


def _exactness_note(cfg: ProfileConfig) -> str:
    held = (
        "which this profile has"
        if cfg.state.shared
        else "which this profile lacks: each replica counts alone"
    )
    return (
        "Limits hold exactly across router replicas — per-key rate limits, per-backend prefill slots "
        f"(max_prefilling, max_long_prefilling), lanes' max_in_flight — only with `state:` (Redis), {held}."
    )


def _router_count_note(cfg: ProfileConfig, opts: K8sOptions) -> str:
    least, most = router_replicas(cfg, opts), router_max_replicas(cfg, opts)
    said = (
        f"{least} router replicas; the profile in the ConfigMap says `replicas: {least}`, so each "
        f"router's part of every lane and prefill limit is limit // {least}"
    )
    if not cfg.state.shared:
        return (
            f"{said}, which is all it enforces without `state:`. No autoscaler for the router: more "
            "replicas would multiply those limits (add `state:` to let it scale)."
        )
    if most is None:
        return f"{said}, which it enforces only while Redis is unreachable; no autoscaler for the router."
    return (
        f"{said}, which it enforces only while Redis is unreachable. The CPU autoscaler runs {least} "
        f"to {most}: while Redis answers every count is exact however many run; should Redis be "
        f"unreachable while more than {least} run, their parts add up to more than the limits (up "
        f"to {most / least:.3g} times them). Set the profile's `replicas:` to the number you want "
        "those parts to assume."
    )
