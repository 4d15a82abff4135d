"""What `lane-router render k8s` takes besides the profile: images, the namespace the objects live
in (the router finds each pool by `<service>.<namespace>.svc.<cluster domain>`), and an optional
autoscaler per pool.

An autoscaler is written `POOL=hpa:MIN-MAX[:WAITING]` or `POOL=keda:MIN-MAX[:WAITING]`: the pool
keeps MIN to MAX vLLM servers and grows while its servers average more than WAITING requests in
vLLM's own queue (`vllm:num_requests_waiting`). These are deployment choices, not the profile's:
the same profile runs with or without them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, cast

from router import __version__
from router.config.lanemap import lane_plan
from router.config.models import DiscoveryConfig, ProfileConfig
from router.config.render import RenderError
from router.config.slo import lane_slo
from router.deploy.plan import Device

AutoscalerKind = Literal["hpa", "keda"]
AUTOSCALER_KINDS: tuple[AutoscalerKind, ...] = ("hpa", "keda")
# What a pool's autoscaler scales on (`--autoscale-on`): the requests waiting in vLLM's queue, its
# lanes' SLO attainment (KEDA only), or both (the larger of the two proposals wins).
ScaleSignal = Literal["waiting", "slo", "both"]
SCALE_SIGNALS: tuple[ScaleSignal, ...] = ("waiting", "slo", "both")
DEFAULT_WAITING = 4.0
# The router caps the backends it uses per pool (DiscoveryConfig.max_backends); an autoscaler
# allowed past it would add servers no router sends to.
DEFAULT_MAX_BACKENDS: int = DiscoveryConfig.model_fields["max_backends"].default

_AUTOSCALER = re.compile(r"(?P<pool>[^=]+)=(?P<kind>\w+):(?P<min>\d+)-(?P<max>\d+)(?::(?P<waiting>[^:]+))?")
_SCRAPER = re.compile(r"(?P<namespace>[^:]+):(?P<labels>[^=,]+=[^=,]*(?:,[^=,]+=[^=,]*)*)")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


@dataclass(frozen=True, slots=True)
class Autoscaler:
    """One pool's autoscaler: its kind, its replica range, and the average number of requests
    waiting per server above which it adds one."""

    pool: str
    kind: AutoscalerKind
    min_replicas: int
    max_replicas: int
    waiting: float = DEFAULT_WAITING


@dataclass(frozen=True, slots=True)
class Scraper:
    """The pods allowed to read the autoscaled pools' `/metrics` (Prometheus), by namespace and
    pod labels."""

    namespace: str = "monitoring"
    labels: tuple[tuple[str, str], ...] = (("app.kubernetes.io/name", "prometheus"),)


@dataclass(frozen=True, slots=True)
class K8sOptions:
    device: Device = "gpu"
    router_image: str = f"lane-router:{__version__}"
    vllm_image: str | None = None  # "{version}" is replaced by the pool's vLLM version
    router_replicas: int = 2
    router_max_replicas: int = 10
    cache_size: str = "64Gi"
    cpu_kv_cache_gib: int = 4
    namespace: str = "lane-router"
    cluster_domain: str = "cluster.local"
    autoscalers: tuple[Autoscaler, ...] = ()
    prometheus_url: str = "http://prometheus.monitoring.svc:9090"  # what KEDA queries
    scraper: Scraper = Scraper()
    autoscale_on: ScaleSignal = "waiting"

    def autoscaler(self, pool: str) -> Autoscaler | None:
        return next((a for a in self.autoscalers if a.pool == pool), None)


DEFAULTS = K8sOptions()


def parse_autoscaler(text: str) -> Autoscaler:
    """`POOL=hpa:MIN-MAX[:WAITING]` or `POOL=keda:MIN-MAX[:WAITING]`."""
    found = _AUTOSCALER.fullmatch(text.strip())
    if found is None:
        raise ValueError(f"{text!r}: expected POOL=hpa:MIN-MAX[:WAITING] or POOL=keda:MIN-MAX[:WAITING]")
    kind = found["kind"]
    if kind not in AUTOSCALER_KINDS:
        raise ValueError(f"{text!r}: autoscaler {kind!r} is neither hpa nor keda")
    low, high = int(found["min"]), int(found["max"])
    if not 1 <= low <= high:
        # Zero servers leave the pool's lanes without a backend, and no server to measure a queue on.
        raise ValueError(f"{text!r}: need 1 ≤ MIN ≤ MAX")
    waiting = DEFAULT_WAITING if found["waiting"] is None else _positive(text, found["waiting"])
    return Autoscaler(
        pool=found["pool"],
        kind=cast(AutoscalerKind, kind),
        min_replicas=low,
        max_replicas=high,
        waiting=waiting,
    )


def _positive(text: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not 0 < number < float("inf"):
        raise ValueError(f"{text!r}: WAITING must be a positive number, not {value!r}")
    return number


def parse_scraper(text: str) -> Scraper:
    """`NAMESPACE:LABEL=VALUE[,LABEL=VALUE…]`."""
    found = _SCRAPER.fullmatch(text.strip())
    if found is None or not _DNS_LABEL.fullmatch(found["namespace"]):
        raise ValueError(f"{text!r}: expected NAMESPACE:LABEL=VALUE[,LABEL=VALUE...]")
    pairs = (pair.split("=", 1) for pair in found["labels"].split(","))
    return Scraper(found["namespace"], tuple((key, value) for key, value in pairs))


def check_options(cfg: ProfileConfig, opts: K8sOptions) -> None:
    """What no single object's schema catches: names the objects are found by, and autoscalers
    that name no pool, the same pool twice, or more servers than the router would use."""
    if opts.router_replicas < 2 or opts.router_max_replicas < opts.router_replicas:
        raise RenderError("the router runs at least 2 replicas, and max replicas ≥ replicas")
    if not _DNS_LABEL.fullmatch(opts.namespace):
        raise RenderError(f"namespace {opts.namespace!r} is not a DNS label (lower case, digits, '-')")
    if not _DNS_NAME.fullmatch(opts.cluster_domain):
        raise RenderError(f"cluster domain {opts.cluster_domain!r} is not a DNS name")
    seen: set[str] = set()
    for a in opts.autoscalers:
        if a.pool not in cfg.pools:
            raise RenderError(
                f"autoscaler for {a.pool!r}: the profile has no such pool ({', '.join(cfg.pools)})"
            )
        if a.pool in seen:
            raise RenderError(f"pool {a.pool!r} has two autoscalers")
        seen.add(a.pool)
        if opts.autoscale_on != "waiting" and a.kind != "keda":
            raise RenderError(
                f"autoscaler for {a.pool!r}: scaling on SLO attainment (--autoscale-on "
                f"{opts.autoscale_on}) takes keda, which queries the attainment's recording rule"
            )
        if opts.autoscale_on != "waiting" and not slo_lanes(cfg, a.pool):
            raise RenderError(f"autoscaler for {a.pool!r}: none of the pool's lanes has an SLO to scale on")
        cap = max_backends(cfg, a.pool)
        if cap is not None and a.max_replicas > cap:
            raise RenderError(
                f"pools.{a.pool}.discovery.max_backends: the router uses at most {cap} servers of the "
                f"pool, fewer than its autoscaler's maximum {a.max_replicas}; raise max_backends"
            )


def max_backends(cfg: ProfileConfig, pool: str) -> int | None:
    """The cap the profile sets on the pool's servers; none when it lists them (the rendering
    then chooses one, see `router.deploy.k8s_pools.discovery_source`)."""
    discovery = cfg.pools[pool].discovery
    return None if discovery is None else discovery.max_backends


def slo_lanes(cfg: ProfileConfig, pool: str) -> tuple[str, ...]:
    """The names of the pool's lanes that judge their requests against an SLO."""
    return tuple(
        lane.name
        for lane in lane_plan(cfg)
        if lane.config.pool == pool and lane_slo(lane.cls, lane.config) is not None
    )
