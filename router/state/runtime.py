"""One profile made live: keys, lanes, pools and their backends, built from a validated
`ProfileConfig` and swapped whole on reload (router/state/live.py).

What a reload carries. Counts are facts about servers and lanes, not about the profile: a pool
is known by its name, a backend by its pool and origin, a lane by its name (its class's, or
MODEL:CLASS: router/config/lanemap.py), and while a reload keeps one it keeps the *same
object*, whose settings it replaces in place. So a backend keeps its in-flight and prefilling
counts, health, drift and upstream connections; a pool its admission queue and discovered
members; a lane its in-flight count and waiting requests. Every request, whichever runtime it
started on, counts against the same numbers, so no limit is exceeded because of a reload —
however many follow one another — and new limits apply at once to the requests already counted.
Only what changed is built new (a pool, lane or backend first named now; a backend's connection
pool when the pool's connection settings changed), and what a reload drops drains: a backend
leaves the rotation at once and is closed when idle, a pool no runtime holds any more is closed
(router/fleet/fleet.py). A request in flight keeps what it holds: its runtime, lane, ticket,
backend and connection.

A runtime is built in two steps: first everything that may fail (keys, tokenizer, upstream
keys, the shared state), then the changes to live objects, which cannot — a refused reload
leaves the serving runtime untouched."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from router.balance import BalanceHooks, Balancer, make_balancer
from router.config.lanemap import PlannedLane, lane_plan
from router.config.models import (
    LaneConfig,
    PoolConfig,
    ProfileConfig,
    ResponseIdsConfig,
    SlowClientConfig,
)
from router.config.vllm import server_configuration_hash
from router.fleet.fleet import Fleet
from router.fleet.pool import Pool
from router.keys.auth import KeyRing, build_keys
from router.keys.ratelimit import MemoryRateStore, RateStore
from router.lanes.admission import PrefillLimits
from router.lanes.classify import ClassifyRules
from router.lanes.lane import Lane
from router.lanes.prefixes import PrefixHistory
from router.lanes.route import ModelRoute
from router.lanes.settings import LaneSettings
from router.lanes.slowclient import BufferBudget, SlowClients
from router.observe.metrics import LaneQueueMetrics, Metrics
from router.observe.observer import Observer
from router.proxy.watch import Watchlist
from router.request.tokenizer_source import TokenizerSource
from router.request.tokens import Counters, PromptCosts, PromptCounter, make_counter
from router.state.counters import build_counters
from router.state.redisstores import RedisRateStore, RedisSlowClients
from router.state.responseids import ResponseIds
from router.state.shared import SharedState, redis_url
from router.state.slots.budget import Share
from router.state.slots.counting import Counting, counting_for
from router.tls.upstream import UpstreamTls, upstream_tls


@dataclass(frozen=True, slots=True)
class LagPolicy:
    """When a stream's client lags (router/lanes/slowclient.py): its undelivered bytes past `lag_bytes`."""

    lag_bytes: int

    @classmethod
    def from_config(cls, cfg: SlowClientConfig) -> LagPolicy:
        return cls(cfg.lag_bytes)

    def lagging(self, undelivered_bytes: int) -> bool:
        return undelivered_bytes > self.lag_bytes


@dataclass(eq=False)
class Runtime:
    config: ProfileConfig
    keys: KeyRing
    counter: PromptCounter
    pools: Mapping[str, Pool]
    lanes: Mapping[str, Lane]  # by lane name
    prefixes: PrefixHistory
    metrics: Metrics
    models: Mapping[str, tuple[Pool, ...]]  # every name a pool serves → the pools serving it
    routes: Mapping[str, ModelRoute]  # every name a pool serves → its model's route
    rates: RateStore
    slow_clients: SlowClients
    lag: LagPolicy
    buffers: BufferBudget
    fleet: Fleet
    watchlist: Watchlist  # requests to watch for disconnects
    shared: SharedState | None = None
    responses: ResponseIds = field(default_factory=lambda: ResponseIds(ResponseIdsConfig()))
    observer: Observer = field(default_factory=Observer)  # tracing and the access log, from startup
    # Each served name's prompt counter (its model's tokenizer), and how each model is counted.
    counters: Counters = field(default_factory=lambda: Counters({}, make_counter(None)))
    tokenizers: Mapping[str, TokenizerSource] = field(default_factory=dict)
    counting: Counting = field(default_factory=Counting)  # this process's share, the slot store
    loaded_at: float = field(default_factory=time.time)
    active: int = 0
    superseded: asyncio.Event = field(default_factory=asyncio.Event)  # set when a reload replaced it
    _drained: asyncio.Event | None = None  # made when a drain waits: a request touches no event
    _closed: bool = False
    # Profile settings every request reads, as plain values.
    classify_rules: ClassifyRules = field(init=False)
    max_body_bytes: int = field(init=False)
    debug_headers: bool = field(init=False)

    def __post_init__(self) -> None:
        self.classify_rules = ClassifyRules.of(self.config.classify)
        self.max_body_bytes = self.config.max_body_bytes
        self.debug_headers = self.config.debug_headers

    def enter(self) -> None:
        self.active += 1

    def leave(self) -> None:
        self.active -= 1
        if self.active == 0 and self._drained is not None:
            self._drained.set()
        if self.fleet.pending:
            self.fleet.sweep()  # the request may have been the last one on a draining backend

    async def close_when_drained(self, timeout: float) -> None:
        # No await in a `finally` of this compiled module (docs/compiled.md): closed on every way out.
        try:
            if self.active:
                drained = self._drained = asyncio.Event()
                await asyncio.wait_for(drained.wait(), timeout)
        except TimeoutError:
            pass
        except BaseException as exc:
            await self.aclose()
            raise exc  # named, not bare: docs/compiled.md
        await self.aclose()

    async def aclose(self) -> None:
        """Give up this runtime's hold on its pools (those no other runtime holds close) and on
        the shared state."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.fleet.release(self.pools.values())
        except BaseException as exc:
            await self._release_shared()
            raise exc  # named, not bare: docs/compiled.md
        await self._release_shared()

    async def _release_shared(self) -> None:
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
    worker: Share | None = None,
    observer: Observer | None = None,
) -> Runtime:
    """`worker`: which worker of `lane-router serve --workers N` this process is (default: the
    previous runtime's, else the only one). `observer`: the process's tracer and access log
    (default: the previous runtime's, else none)."""
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
    counters, tokenizers = build_counters(
        cfg, env, (previous.counters, previous.tokenizers) if previous is not None else None
    )
    pool_settings = [_pool_settings(name, pc, env) for name, pc in cfg.pools.items()]
    rp = cfg.classify.repeated_prefix
    prefixes = (
        previous.prefixes
        if previous and _same_prefix_policy(previous, cfg)
        else PrefixHistory(seen=rp.seen, window_s=rp.window_s, max_entries=rp.max_entries)
    )
    sc = cfg.slow_clients
    # Rate counters, slow-client memory and buffered bytes are facts about clients and streams in
    # flight, not about the profile: they survive a reload (unless their own settings changed).
    # Built last of what may fail: a runtime that fails to build must not have taken a share of
    # the old one's state.
    shared = _shared_state(cfg, metrics, env, previous)
    same_state = previous is not None and previous.shared is shared
    keep = previous is not None and previous.config.slow_clients == sc and same_state
    rates: RateStore
    if previous is not None and same_state:
        rates = previous.rates
    else:
        rates = RedisRateStore(shared) if shared is not None else MemoryRateStore()
    before = previous.counting if previous is not None else Counting()
    counting = counting_for(cfg, worker or before.share, shared, before)
    # From here on nothing fails: live pools and lanes change in place.
    fleet = previous.fleet if previous is not None else Fleet(metrics)
    pools = {s.name: _pool(fleet, s, counting) for s in pool_settings}
    fleet.hold(pools.values())
    plan = lane_plan(cfg)
    lanes = {p.name: _lane(p, pools[p.config.pool], metrics, previous) for p in plan}
    for lane in lanes.values():
        lane.settings.max_model_len = lane.pool.max_model_len  # a live context shorter than the profile's
    fleet.wake_waiters()
    responses = _responses(cfg, previous, shared)
    models: dict[str, tuple[Pool, ...]] = {}
    for pool in pools.values():
        for model in pool.config.models:
            models[model] = (*models.get(model, ()), pool)
    return Runtime(
        config=cfg,
        keys=keys,
        counter=counter,
        pools=pools,
        lanes=lanes,
        prefixes=prefixes,
        metrics=metrics,
        models=models,
        routes=_routes(plan, lanes, pools, counters),
        rates=rates,
        slow_clients=previous.slow_clients if previous and keep else _slow_clients(cfg, shared),
        lag=LagPolicy.from_config(sc),
        buffers=previous.buffers if previous and keep else _buffers(cfg, metrics),
        fleet=fleet,
        shared=shared,
        responses=responses,
        observer=observer or (previous.observer if previous is not None else Observer()),
        counting=counting,
        watchlist=Watchlist(sc.watch_disconnect_after_s),
        counters=counters,
        tokenizers=tokenizers,
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


def _responses(cfg: ProfileConfig, previous: Runtime | None, shared: SharedState | None) -> ResponseIds:
    """The response ids survive a reload (they name responses the backends still hold), under
    the new limits and the new shared state."""
    if previous is None:
        return ResponseIds(cfg.response_ids, shared)
    kept = previous.responses
    kept.config = cfg.response_ids
    kept.shared = shared
    return kept


def _slow_clients(cfg: ProfileConfig, shared: SharedState | None) -> SlowClients:
    store = RedisSlowClients(shared) if shared is not None else None
    return SlowClients(cfg.slow_clients.remember_s, cfg.slow_clients.max_remembered, store)


def _buffers(cfg: ProfileConfig, metrics: Metrics) -> BufferBudget:
    return BufferBudget(cfg.slow_clients.max_buffer_bytes, metrics.stream_buffer_bytes.set)


def _routes(
    plan: tuple[PlannedLane, ...],
    lanes: Mapping[str, Lane],
    pools: Mapping[str, Pool],
    counters: Counters,
) -> dict[str, ModelRoute]:
    """Every name a pool serves (its model, aliases, adapters) → the route of the pool's model."""
    by_model: dict[str, ModelRoute] = {}
    for p in plan:
        route = by_model.get(p.model)
        if route is None:
            serving = tuple(pool for pool in pools.values() if pool.config.model == p.model)
            route = by_model[p.model] = ModelRoute(p.model, {}, counters.get(p.model), serving)
        route.lanes[p.cls] = lanes[p.name]
    return {name: by_model[pool.config.model] for pool in pools.values() for name in pool.config.models}


def _lane(planned: PlannedLane, pool: Pool, metrics: Metrics, previous: Runtime | None) -> Lane:
    """The lane of that name: the previous runtime's, reconfigured, else a new one."""
    lane = previous.lanes.get(planned.name) if previous is not None else None
    if lane is None:
        return _new_lane(planned, pool, metrics)
    _reconfigure_lane(lane, planned.config, pool, metrics)
    lane.model = planned.model
    return lane


def _new_lane(planned: PlannedLane, pool: Pool, metrics: Metrics) -> Lane:
    lc = planned.config
    return Lane(
        cls=planned.cls,
        config=lc,
        pool=pool,
        balancer=_balancer(lc, pool, metrics),
        queue_time=metrics.queue_time.labels(planned.name),
        queue_metrics=LaneQueueMetrics(metrics, planned.name),
        model=planned.model,
        name=planned.name,
    )


def _reconfigure_lane(lane: Lane, lc: LaneConfig, pool: Pool, metrics: Metrics) -> None:
    """Requests already queued in the lane's old pool stay there and are served by it."""
    if pool is not lane.pool or lc.balance != lane.config.balance:
        # A balancer's memory (a round-robin position, recent prompts) is worth keeping only
        # for the same pool and strategy.
        lane.balancer = _balancer(lc, pool, metrics)
    lane.config = lc
    lane.pool = pool
    lane.settings = LaneSettings(lc, pool.config, lane.cls)


def _balancer(lc: LaneConfig, pool: Pool, metrics: Metrics) -> Balancer:
    hits = metrics.prefix_affinity_hits.labels(pool.name)
    estimated = metrics.precise_prefix_estimated.labels(pool.name)
    hooks = BalanceHooks(
        on_affinity_hit=hits.inc, cached_tokens=pool.kv.cached_tokens, on_estimated=estimated.inc
    )
    return make_balancer(lc.balance, hooks)


def _same_prefix_policy(previous: Runtime, cfg: ProfileConfig) -> bool:
    return previous.config.classify.repeated_prefix == cfg.classify.repeated_prefix


@dataclass(frozen=True, slots=True)
class _PoolSettings:
    """What a pool takes from the profile, worked out before any live object changes."""

    name: str
    config: PoolConfig
    upstream_key: bytes | None
    config_hash: str
    limits: PrefillLimits
    tls: UpstreamTls | None


def _pool_settings(name: str, pc: PoolConfig, env: Mapping[str, str]) -> _PoolSettings:
    upstream_key = pc.upstream_api_key
    if pc.upstream_api_key_env:
        upstream_key = env.get(pc.upstream_api_key_env, upstream_key)
    return _PoolSettings(
        name=name,
        config=pc,
        upstream_key=upstream_key.encode("latin-1") if upstream_key else None,
        config_hash=server_configuration_hash(pc.vllm, pc.model),
        limits=PrefillLimits.for_pool(pc),
        tls=upstream_tls(pc, f"pools.{name}"),
    )


def _pool(fleet: Fleet, settings: _PoolSettings, counting: Counting) -> Pool:
    """The pool of that name some runtime holds, reconfigured, else a new one. A listed pool's
    members are its list; a discovery pool keeps the members it has until its name answers."""
    pool = fleet.find(settings.name)
    if pool is None:
        pool = _new_pool(settings, counting)
    else:
        _reconfigure_pool(fleet, pool, settings, counting)
    if settings.config.discovery is None:
        fleet.set_members(pool, settings.config.origins, probation=False)
    return pool


def _new_pool(settings: _PoolSettings, counting: Counting) -> Pool:
    pool = Pool(
        name=settings.name,
        config=settings.config,
        upstream_key=settings.upstream_key,
        config_hash=settings.config_hash,
        tls=settings.tls,
    )
    pool.gate = counting.gate(settings.limits, pool)
    return pool


def _reconfigure_pool(fleet: Fleet, pool: Pool, settings: _PoolSettings, counting: Counting) -> None:
    pool.config = settings.config
    pool.upstream_key = settings.upstream_key
    pool.config_hash = settings.config_hash
    pool.tls = settings.tls
    counting.configure(pool.gate, settings.limits)
    fleet.reconnect(pool)
