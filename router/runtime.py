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

from prometheus_client import Histogram

from router.admission import PrefillLimits
from router.auth import KeyRing, build_keys
from router.balance import BalanceHooks, Balancer, corrected_load, make_balancer
from router.config.models import LaneConfig, PoolConfig, ProfileConfig, RequestClass
from router.config.vllm import server_configuration_hash
from router.metrics import Metrics
from router.poolgate import PoolGate
from router.prefixes import PrefixHistory
from router.proxy.upstream import UpstreamPool
from router.ratelimit import MemoryRateStore, RateStore
from router.redisstores import RedisRateStore, RedisSlowClients
from router.sharedstate import SharedState, redis_url
from router.slowclient import BufferBudget, LagPolicy, SlowClients
from router.tokens import PromptCosts, PromptCounter, make_counter


class Health(Enum):
    UNKNOWN = "unknown"
    UP = "up"
    DOWN = "down"


def backend_label(pool: str, index: int) -> str:
    """How messages that clients may see name a backend: by its pool and its position in the
    pool's `backends` list (from 0), never by its address."""
    return f"pool {pool!r} backend {index}"


@dataclass(eq=False)
class Backend:
    """One vLLM server of a pool, with the live counters balancing and health read. `name` is
    its origin, for logs and metric labels; `label` names it to clients."""

    pool: str
    name: str
    upstream: UpstreamPool
    index: int = 0
    health: Health = Health.UNKNOWN
    in_flight: int = 0
    prefilling: int = 0
    long_prefilling: int = 0
    consecutive_failures: int = 0
    consecutive_successes: int = 0
    # The last scrape of the backend's own /metrics (router.scrape), and this router's in-flight
    # count at that moment, so the sample can be corrected until the next one.
    scraped: bool = False
    scraped_running: float = 0.0
    scraped_waiting: float = 0.0
    scraped_kv_usage: float = 0.0
    in_flight_at_scrape: int = 0
    drift: tuple[str, ...] = ()
    auth_failure_logged_at: float | None = None  # monotonic time of the last such warning

    @property
    def label(self) -> str:
        return backend_label(self.pool, self.index)

    @property
    def routable(self) -> bool:
        return self.health is not Health.DOWN

    @property
    def load_score(self) -> float:
        return corrected_load(
            self.in_flight,
            self.in_flight_at_scrape,
            self.scraped_running,
            self.scraped_waiting,
            self.scraped_kv_usage,
            self.scraped,
        )


@dataclass(eq=False)
class Pool:
    name: str
    config: PoolConfig
    backends: tuple[Backend, ...]
    upstream_key: bytes | None
    config_hash: str
    gate: PoolGate = field(init=False)

    def __post_init__(self) -> None:
        self.gate = PoolGate(PrefillLimits.for_pool(self.config), self.routable)

    def routable(self, exclude: frozenset[Backend] = frozenset()) -> list[Backend]:
        if not exclude:
            return [b for b in self.backends if b.health is not Health.DOWN]
        return [b for b in self.backends if b.health is not Health.DOWN and b not in exclude]

    def has_healthy_backend(self) -> bool:
        return any(b.health is Health.UP for b in self.backends)


@dataclass(eq=False)
class Lane:
    cls: RequestClass
    config: LaneConfig
    pool: Pool
    balancer: Balancer
    queue_time: Histogram
    in_flight: int = 0
    waiting: int = 0

    @property
    def name(self) -> str:
        return self.cls.value


@dataclass(eq=False)
class Runtime:
    config: ProfileConfig
    keys: KeyRing
    counter: PromptCounter
    pools: Mapping[str, Pool]
    lanes: Mapping[RequestClass, Lane]
    prefixes: PrefixHistory
    metrics: Metrics
    models: Mapping[str, tuple[Pool, ...]]
    rates: RateStore
    slow_clients: SlowClients
    lag: LagPolicy
    buffers: BufferBudget
    shared: SharedState | None = None
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
        try:
            for pool in self.pools.values():
                for backend in pool.backends:
                    await backend.upstream.aclose()
        finally:
            if self.shared is not None:
                await self.shared.release()

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
    keys = KeyRing(
        build_keys(
            cfg.keys,
            env,
            rules=cfg.request_fields,
            isolate_caches=cfg.prefix_cache_isolation == "per_key",
        )
    )
    counter = make_counter(cfg.tokenizer, PromptCosts(**cfg.prompt_costs.model_dump()))
    pools = {name: _build_pool(name, pc, env, previous) for name, pc in cfg.pools.items()}
    lanes = {cls: _build_lane(cls, lc, pools[lc.pool], metrics) for cls, lc in cfg.lanes.items()}
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
    sc = cfg.slow_clients
    # Rate counters, slow-client memory and buffered bytes are facts about clients and streams in
    # flight, not about the profile: they survive a reload (unless their own settings changed).
    # Built last: a runtime that fails to build must not have taken a share of the old one's state.
    shared = _shared_state(cfg, metrics, env, previous)
    same_state = previous is not None and previous.shared is shared
    keep = previous is not None and previous.config.slow_clients == sc and same_state
    rates: RateStore
    if previous is not None and same_state:
        rates = previous.rates
    else:
        rates = RedisRateStore(shared) if shared is not None else MemoryRateStore()
    return Runtime(
        config=cfg,
        keys=keys,
        counter=counter,
        pools=pools,
        lanes=lanes,
        prefixes=prefixes,
        metrics=metrics,
        models=models,
        rates=rates,
        slow_clients=previous.slow_clients if previous and keep else _slow_clients(cfg, shared),
        lag=LagPolicy.from_config(sc),
        buffers=previous.buffers if previous and keep else _buffers(cfg, metrics),
        shared=shared,
    )


def _shared_state(
    cfg: ProfileConfig, metrics: Metrics, env: Mapping[str, str], previous: Runtime | None
) -> SharedState | None:
    """The previous runtime's shared state when the `state:` section (and the URL it resolves
    to) is unchanged, else a new one; None when the profile keeps state in memory."""
    url = redis_url(cfg.state, env)
    if url is None:
        return None
    old = previous.shared if previous is not None else None
    if old is not None and old.same_as(cfg.state, url):
        return old.retain()
    return SharedState(cfg.state, url, metrics)


def _slow_clients(cfg: ProfileConfig, shared: SharedState | None) -> SlowClients:
    store = RedisSlowClients(shared) if shared is not None else None
    return SlowClients(cfg.slow_clients.remember_s, cfg.slow_clients.max_remembered, store)


def _buffers(cfg: ProfileConfig, metrics: Metrics) -> BufferBudget:
    return BufferBudget(cfg.slow_clients.max_buffer_bytes, metrics.stream_buffer_bytes.set)


def _build_lane(cls: RequestClass, lc: LaneConfig, pool: Pool, metrics: Metrics) -> Lane:
    hits = metrics.prefix_affinity_hits.labels(pool.name)
    balancer = make_balancer(lc.balance, BalanceHooks(on_affinity_hit=hits.inc))
    return Lane(
        cls=cls,
        config=lc,
        pool=pool,
        balancer=balancer,
        queue_time=metrics.queue_time.labels(cls.value),
    )


def _same_prefix_policy(previous: Runtime, cfg: ProfileConfig) -> bool:
    return previous.config.classify.repeated_prefix == cfg.classify.repeated_prefix


def _build_pool(name: str, pc: PoolConfig, env: Mapping[str, str], previous: Runtime | None) -> Pool:
    known: dict[str, Backend] = {}
    if previous is not None and name in previous.pools:
        known = {b.name: b for b in previous.pools[name].backends}
    backends = []
    for index, origin in enumerate(pc.origins):
        upstream = UpstreamPool(
            origin,
            max_connections=pc.max_connections,
            connect_timeout=pc.connect_timeout_s,
            read_timeout=pc.read_timeout_s,
            head_timeout=pc.response_head_timeout_s,
            head_read_timeout=pc.head_read_timeout_s,
            idle_expiry=pc.upstream_keepalive_s,
            label=backend_label(name, index),
        )
        backend = Backend(pool=name, name=origin, upstream=upstream, index=index)
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
