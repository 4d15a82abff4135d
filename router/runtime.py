"""One profile made live: keys, lanes, pools and their backends, built once from a validated
`ProfileConfig` and swapped whole on reload. Requests hold a reference to the runtime they
started on, so a reload never changes the ground under a request in flight."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from router.auth import KeyRing, build_keys
from router.balance import Balancer, make_balancer
from router.config.models import LaneConfig, PoolConfig, ProfileConfig, RequestClass
from router.config.vllm import server_configuration_hash
from router.metrics import Metrics
from router.prefixes import PrefixHistory
from router.proxy.upstream import UpstreamPool
from router.tokens import TokenCounter, make_counter


class Health(Enum):
    UNKNOWN = "unknown"
    UP = "up"
    DOWN = "down"


@dataclass(eq=False)
class Backend:
    """One vLLM server of a pool, with the live counters balancing and health read."""

    pool: str
    name: str
    upstream: UpstreamPool
    health: Health = Health.UNKNOWN
    in_flight: int = 0
    prefilling: int = 0
    long_prefilling: int = 0
    consecutive_failures: int = 0
    consecutive_successes: int = 0
    # Scraped from the backend's own /metrics (vllm:num_requests_waiting, kv_cache_usage_perc).
    scraped_waiting: float = 0.0
    scraped_kv_usage: float = 0.0
    drift: tuple[str, ...] = ()

    @property
    def routable(self) -> bool:
        return self.health is not Health.DOWN

    @property
    def load_score(self) -> float:
        return self.in_flight + self.scraped_waiting + self.scraped_kv_usage


@dataclass(eq=False)
class Pool:
    name: str
    config: PoolConfig
    backends: tuple[Backend, ...]
    upstream_key: bytes | None
    config_hash: str

    def routable(self, exclude: frozenset[Backend] = frozenset()) -> list[Backend]:
        return [b for b in self.backends if b.routable and b not in exclude]

    def has_healthy_backend(self) -> bool:
        return any(b.health is Health.UP for b in self.backends)


@dataclass(eq=False)
class Lane:
    cls: RequestClass
    config: LaneConfig
    pool: Pool
    balancer: Balancer
    in_flight: int = 0

    @property
    def name(self) -> str:
        return self.cls.value


@dataclass(eq=False)
class Runtime:
    config: ProfileConfig
    keys: KeyRing
    counter: TokenCounter
    pools: Mapping[str, Pool]
    lanes: Mapping[RequestClass, Lane]
    prefixes: PrefixHistory
    metrics: Metrics
    models: Mapping[str, tuple[Pool, ...]]
    loaded_at: float = field(default_factory=time.time)
    active: int = 0
    _drained: asyncio.Event = field(default_factory=asyncio.Event)

    def enter(self) -> None:
        self.active += 1
        self._drained.clear()

    def leave(self) -> None:
        self.active -= 1
        if self.active == 0:
            self._drained.set()

    async def close_when_drained(self, timeout: float) -> None:
        try:
            if self.active:
                await asyncio.wait_for(self._drained.wait(), timeout)
        except TimeoutError:
            pass
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        for pool in self.pools.values():
            for backend in pool.backends:
                await backend.upstream.aclose()

    def ready(self) -> bool:
        return all(lane.pool.has_healthy_backend() for lane in self.lanes.values())


def build_runtime(
    cfg: ProfileConfig,
    metrics: Metrics,
    *,
    previous: Runtime | None = None,
    environ: Mapping[str, str] | None = None,
) -> Runtime:
    env = os.environ if environ is None else environ
    keys = KeyRing(build_keys(cfg.keys, env))
    counter = make_counter(cfg.tokenizer)
    pools = {name: _build_pool(name, pc, env, previous) for name, pc in cfg.pools.items()}
    lanes = {
        cls: Lane(cls=cls, config=lc, pool=pools[lc.pool], balancer=make_balancer(lc.balance))
        for cls, lc in cfg.lanes.items()
    }
    models: dict[str, tuple[Pool, ...]] = {}
    for pool in pools.values():
        for model in pool.config.models:
            models[model] = (*models.get(model, ()), pool)
    rp = cfg.classify.repeated_prefix
    prefixes = (
        previous.prefixes
        if previous and _same_prefix_policy(previous, cfg)
        else PrefixHistory(seen=rp.seen, window_s=rp.window_s, max_entries=rp.max_entries)
    )
    return Runtime(
        config=cfg,
        keys=keys,
        counter=counter,
        pools=pools,
        lanes=lanes,
        prefixes=prefixes,
        metrics=metrics,
        models=models,
    )


def _same_prefix_policy(previous: Runtime, cfg: ProfileConfig) -> bool:
    return previous.config.classify.repeated_prefix == cfg.classify.repeated_prefix


def _build_pool(name: str, pc: PoolConfig, env: Mapping[str, str], previous: Runtime | None) -> Pool:
    known: dict[str, Backend] = {}
    if previous is not None and name in previous.pools:
        known = {b.name: b for b in previous.pools[name].backends}
    backends = []
    for origin in pc.origins:
        upstream = UpstreamPool(
            origin,
            max_connections=pc.max_connections,
            connect_timeout=pc.connect_timeout_s,
            read_timeout=pc.read_timeout_s,
        )
        backend = Backend(pool=name, name=origin, upstream=upstream)
        if origin in known:
            # Health is a fact about the server, not the profile: keep it across a reload.
            backend.health = known[origin].health
            backend.drift = known[origin].drift
        backends.append(backend)
    upstream_key = pc.upstream_api_key
    if pc.upstream_api_key_env:
        upstream_key = env.get(pc.upstream_api_key_env, upstream_key)
    return Pool(
        name=name,
        config=pc,
        backends=tuple(backends),
        upstream_key=upstream_key.encode("latin-1") if upstream_key else None,
        config_hash=server_configuration_hash(pc.vllm, pc.model),
    )
