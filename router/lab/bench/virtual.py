"""Run a trace on the simulator's virtual clock behind the router's own routing.

Each pool of the profile becomes simulated engines — the preset's hardware with the pool's
`vllm:` settings on top — and every arrival is placed by `VirtualRouter`. Agent sessions stay
closed loop: the simulator reports each finished step and the next one is added `think_s`
later. Slow readers are modelled on the client side (`router.lab.bench.reader`): an engine does not
wait for its readers (vLLM queues output per request), so a slow reader sees its first token when
it is produced and each later piece no sooner than its reading speed allows; the router learns
the client is slow when what it could not deliver exceeds its `lag_bytes`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from router.config.models import PoolConfig, ProfileConfig
from router.keys.tenant import Tenant
from router.lab.bench.generate import Request, SessionPlan, Trace
from router.lab.bench.kvfeed import KVFeed
from router.lab.bench.lanequeue import Cost, VirtualGate
from router.lab.bench.loadclient import new_outcome
from router.lab.bench.outcome import Outcome
from router.lab.bench.progress import Bar
from router.lab.bench.reader import read_stream
from router.lab.bench.realtime import ABANDONED
from router.lab.bench.routing import VirtualRouter
from router.lab.sim.profile import engine_config
from router.lab.sim.timing import Preset
from router.lab.sim.vclock import (
    BackendSummary,
    Change,
    RequestRecord,
    TraceRequest,
    VirtualBackend,
    VirtualCluster,
)

SHARED_KEY = Tenant("shared")  # every tenant's requests as one key's: the queue is FIFO


@dataclass(frozen=True, slots=True)
class VirtualOptions:
    engines: int | None = None  # total engines; None: one per backend the profile lists
    pool_engines: Mapping[str, int] = field(default_factory=dict)  # fixed counts for named pools
    scrape_interval: float = 0.0
    progress: bool = True
    desc: str = "virtual"
    # Model the lanes' admission and queue (router/lab/bench/lanequeue.py), each waiter costing
    # one request or its tokens; None: every request goes to an engine at once.
    queue: Cost | None = None
    # With a queue: each workload tenant waits as its own key (fair across them), or every
    # request as one key (first come, first served).
    key_per_tenant: bool = True
    # The engines publish their KV events, reaching the pools' views this long after each step
    # (router/lab/bench/kvfeed.py); None: they publish none.
    kv_events_delay: float | None = None
    engine_overrides: Mapping[str, Any] = field(default_factory=dict)  # e.g. num_gpu_blocks
    # Backends joining and leaving during the run (by index), and those absent at its start.
    changes: tuple[Change, ...] = ()
    absent: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PoolUse:
    """How hard a pool's engines worked over the run."""

    engines: int
    busy: float  # modelled step time over engines × time to the pool's last answer (1: never idle)
    prefix_hit_rate: float
    preemptions: int


@dataclass(frozen=True, slots=True)
class VirtualRun:
    outcomes: list[Outcome]
    pools: dict[str, PoolUse]
    end_time: float
    backends: list[BackendSummary] = field(default_factory=list)
    estimated: int = 0  # backends a precise lane judged by approximation, over every placement


def allocate(sizes: Mapping[str, int], total: int) -> dict[str, int]:
    """Split `total` engines over pools in proportion to `sizes` (largest remainder, at least one
    each), so every profile can be given the same number of engines."""
    if total < len(sizes):
        raise ValueError(f"{total} engines cannot serve {len(sizes)} pools (one each at least)")
    whole = sum(sizes.values())
    quotas = {name: total * n / whole for name, n in sizes.items()}
    counts = {name: max(1, math.floor(q)) for name, q in quotas.items()}
    by_remainder = sorted(sizes, key=lambda n: (counts[n] - quotas[n], n))
    i = 0
    while sum(counts.values()) < total:
        counts[by_remainder[i % len(by_remainder)]] += 1
        i += 1
    by_size = sorted(sizes, key=lambda n: (-counts[n], n))
    i = 0
    while sum(counts.values()) > total:
        name = by_size[i % len(by_size)]
        if counts[name] > 1:
            counts[name] -= 1
        i += 1
    return counts


def pool_counts(
    cfg: ProfileConfig, engines: int | None = None, fixed: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Engines per pool: `fixed` ones as given, the rest of `engines` (default: the profile's own
    backend count) spread over the other pools in proportion to the profile. A pool found by DNS
    lists no count: it counts as one engine, its smallest size (`fixed` or `engines` says more)."""
    fixed = {name: n for name, n in (fixed or {}).items() if name in cfg.pools}
    sizes = {name: _listed(pool) for name, pool in cfg.pools.items() if name not in fixed}
    if not sizes:
        return dict(fixed)
    if engines is None and not fixed:
        return sizes
    total = engines if engines is not None else sum(_listed(p) for p in cfg.pools.values())
    return {**allocate(sizes, total - sum(fixed.values())), **fixed}


def _listed(pool: PoolConfig) -> int:
    return len(pool.backends) if pool.discovery is None else 1


def profile_backends(
    cfg: ProfileConfig,
    preset: Preset,
    engines: int | None = None,
    fixed: Mapping[str, int] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> list[VirtualBackend]:
    counts = pool_counts(cfg, engines, fixed)
    out: list[VirtualBackend] = []
    for name, pool in cfg.pools.items():
        config = engine_config(preset, pool.vllm.model_dump(), **(overrides or {}))
        origins = pool.origins
        for i in range(counts[name]):
            # The profile's own backend names where there are enough (they feed rendezvous hashing).
            label = origins[i] if i < len(origins) else f"http://{name}-{i}.sim:8000"
            out.append(
                VirtualBackend(
                    name=label, pool=name, config=config, timing=preset.timing, served_model_names=pool.models
                )
            )
    return out


class _Driver:
    def __init__(
        self,
        trace: Trace,
        router: VirtualRouter,
        backends: list[VirtualBackend],
        bar: Bar,
        *,
        key_per_tenant: bool = True,
    ) -> None:
        self.trace = trace
        self.router = router
        self.backends = backends
        self.bar = bar
        self.requests: dict[str, Request] = {}
        self.sessions: dict[str, SessionPlan] = {}
        self.abandoned: list[Outcome] = []
        self.cluster: VirtualCluster | None = None
        self.keys = {
            t.name: Tenant(t.name, t.weight, t.tier) if key_per_tenant else SHARED_KEY
            for t in trace.workload.tenants
        }

    def initial(self) -> list[TraceRequest]:
        out = []
        for item in self.trace.items:
            first = item.steps[0] if isinstance(item, SessionPlan) else item
            if isinstance(item, SessionPlan):
                self.sessions[item.session_id] = item
            out.append(self._trace_request(first, item.arrival))
        return out

    def _trace_request(self, req: Request, at: float) -> TraceRequest:
        self.requests[req.request_id] = req
        self.router.clients[req.request_id] = req.client_id
        self.router.tenants[req.request_id] = self.keys.get(req.tenant, SHARED_KEY)
        return TraceRequest(request_id=req.request_id, arrival=at, body=req.body, kind="chat", label=req.cls)

    def on_done(self, rec: RequestRecord, now: float) -> list[TraceRequest]:
        self.bar.update()
        self._admit(rec.request_id, now)
        req = self.requests[rec.request_id]
        if req.read_rate is not None and rec.first_token is not None:
            stream = read_stream(rec.first_token, rec.itl, rec.output_tokens, req.read_rate)
            self.router.observe_stream(req.request_id, stream, now)
        if req.session is None:
            return []
        plan = self.sessions[req.session]
        rest = plan.steps[req.step + 1 :]
        if not rest:
            return []
        if rec.status != 200 or rec.finish is None:
            for step in rest:
                out = new_outcome(step, now)
                out.error = ABANDONED
                self.abandoned.append(out)
            self.bar.update(len(rest))
            return []
        nxt = rest[0]
        return [self._trace_request(nxt, now + nxt.think_s)]

    def _admit(self, request_id: str, now: float) -> None:
        """The router's queue after a request ended: its slot to the next waiters, and the
        waiters it refused (deadline passed, or their place taken by another key) answered 503."""
        cluster = self.cluster
        assert cluster is not None
        for granted in self.router.finished(request_id, now):
            cluster.release(granted, now)
        gate = self.router.gate
        while gate is not None and gate.refused:
            refused, gate.refused = gate.refused, []
            for rid in refused:
                cluster.refuse(rid, 503, now)

    def outcome(self, rec: RequestRecord) -> Outcome:
        req = self.requests[rec.request_id]
        out = new_outcome(req, rec.arrival)
        decision = self.router.decisions.get(rec.request_id)
        if decision is not None:
            out.lane, out.routed_class, out.reason = decision.lane, decision.cls, decision.reason
        if rec.backend is not None:
            out.backend = self.backends[rec.backend].name
        out.status = rec.status if rec.status else 503  # 0: the router refused it
        if rec.finish is None or rec.first_token is None:
            if out.status == 200:
                out.status, out.error = 0, "no answer"
            return out
        out.output_tokens = rec.output_tokens
        out.e2e = rec.finish - rec.arrival
        if req.stream:
            stream = read_stream(rec.first_token, rec.itl, rec.output_tokens, req.read_rate)
            out.e2e = max(rec.finish, stream.done) - rec.arrival
            out.ttft = rec.first_token - rec.arrival
            out.gaps = stream.gaps
        else:
            out.ttft = out.e2e
        return out


def run_virtual(
    trace: Trace, cfg: ProfileConfig, preset: Preset, opts: VirtualOptions | None = None
) -> VirtualRun:
    """Simulate `trace` on the engines of `cfg` (or `opts.engines` of them, spread over its pools)."""
    opts = opts or VirtualOptions()
    backends = profile_backends(cfg, preset, opts.engines, opts.pool_engines, opts.engine_overrides)
    gate = VirtualGate(opts.queue) if opts.queue is not None else None
    router = VirtualRouter(cfg, gate=gate)
    if opts.kv_events_delay is not None:
        router.feed = kv_feed(router, backends, opts.kv_events_delay)
    try:
        with Bar(trace.request_count, opts.desc, enabled=opts.progress) as bar:
            driver = _Driver(trace, router, backends, bar, key_per_tenant=opts.key_per_tenant)
            cluster = driver.cluster = VirtualCluster(
                backends,
                scrape_interval=opts.scrape_interval,
                members=router.feed,
                changes=opts.changes,
                absent=opts.absent,
            )
            result = cluster.run(driver.initial(), router.pick, driver.on_done)
    finally:
        if gate is not None:
            gate.close()
    outcomes = [driver.outcome(r) for r in result.records] + driver.abandoned
    return VirtualRun(
        outcomes=outcomes,
        pools=pool_use(result.backends, result.records),
        end_time=result.end_time,
        backends=result.backends,
        estimated=router.estimated,
    )


def kv_feed(router: VirtualRouter, backends: Sequence[VirtualBackend], delay: float) -> KVFeed:
    """Each engine's events into its pool's view (the router keeps one per pool)."""
    pools = router.runtime.pools
    return KVFeed([b.name for b in backends], [pools[b.pool].kv for b in backends], delay)


def pool_use(backends: Sequence[BackendSummary], records: Sequence[RequestRecord]) -> dict[str, PoolUse]:
    """Per pool: engines, busy share until the pool's last answer, prefix-cache hit rate."""
    ends: dict[str, float] = {}
    for rec in records:
        if rec.backend is not None and rec.finish is not None:
            pool = backends[rec.backend].pool
            ends[pool] = max(ends.get(pool, 0.0), rec.finish)
    by_pool: dict[str, list[BackendSummary]] = {}
    for b in backends:
        by_pool.setdefault(b.pool, []).append(b)
    out = {}
    for name, items in by_pool.items():
        queries = sum(b.prefix_queries for b in items)
        span = ends.get(name, 0.0)
        out[name] = PoolUse(
            engines=len(items),
            busy=sum(b.busy_time for b in items) / (len(items) * span) if span > 0 else 0.0,
            prefix_hit_rate=sum(b.prefix_hits for b in items) / queries if queries else 0.0,
            preemptions=sum(b.preemptions for b in items),
        )
    return out
