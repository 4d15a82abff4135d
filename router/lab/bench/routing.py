"""The router's own routing decisions, driven by virtual time: a `pick` for the simulator.

Nothing here decides anything itself. A runtime is built from the profile with the router's
`build_runtime` (its lanes, their balancers, the repeated-prefix memory, the token counter), and
each arrival goes through the same steps as `router.proxy.handler`: `parse_facts` →
repeated-prefix sighting → `classify` → the class's lane → the lane's balancer over the lane
pool's backends, with the handler's `affinity_for`. The differences are the clock — the
prefix and slow-client memories are fed virtual time instead of the wall clock — and how a slow
client is noticed: the relay measures undelivered bytes on real sockets, here they come from the
modelled reader (`router.lab.bench.reader`) and the simulator's own SSE bytes.

Not modelled unless a `VirtualGate` is given: the router's admission (lane `max_in_flight`,
its queue, fair across keys, with deadlines; router/lab/bench/lanequeue.py). Without one every
request is placed at once and waits in the engine's own queue, first come first served. The
per-backend prefill limits are not modelled either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson

from router.balance import (
    Affinity,
    BalanceHooks,
    corrected_load,
    make_balancer,
    places_on_token_ids,
)
from router.config.models import ProfileConfig
from router.errors import RouterError
from router.keys.auth import ApiKey
from router.keys.tenant import ANONYMOUS, Tenant
from router.lab.bench.kvfeed import KVFeed
from router.lab.bench.lanequeue import VirtualGate
from router.lab.bench.reader import ReadStream, first_lag
from router.lab.sim.protocol import ChunkWriter
from router.lab.sim.vclock import WAIT, BackendState, TraceRequest
from router.lanes.classify import Signals, classify
from router.lanes.lane import Lane
from router.lanes.slowclient import client_identity
from router.observe.metrics import Metrics
from router.proxy.handler import affinity_for, engine_token_ids
from router.request.facts import parse_facts
from router.request.tokens import CHARS_PER_TOKEN
from router.state.runtime import Runtime, build_runtime


def open_key(name: str = "bench") -> ApiKey:
    """A key with no restriction: the workload's clients may send any class and model."""
    return ApiKey(
        name=name,
        digest=b"",
        classes=None,
        models=None,
        pin_class=None,
        may_set_class=False,
        admin=False,
        metrics=False,
        rpm=None,
        tpm=None,
        max_concurrency=None,
    )


@dataclass(frozen=True, slots=True)
class Decision:
    cls: str
    reason: str
    lane: str
    pool: str


@dataclass(frozen=True, slots=True)
class Seen:
    """A backend as a balancer sees it, its load computed by the router's `corrected_load` from
    a fresh scrape (the simulator's engine counters at the arrival)."""

    index: int
    name: str
    in_flight: int
    load_score: float

    @classmethod
    def of(cls, s: BackendState) -> Seen:
        load = corrected_load(
            s.in_flight, s.in_flight, s.num_running, s.num_waiting, s.kv_cache_usage, scraped=True
        )
        return cls(s.index, s.name, s.in_flight, load)


class VirtualRouter:
    """`pick(states, request)` as the router would place `request` at its arrival time."""

    def __init__(
        self, cfg: ProfileConfig, key: ApiKey | None = None, gate: VirtualGate | None = None
    ) -> None:
        # Keys are not needed to route (the caller's key is given) and may name env variables
        # that are not set here. The engines are simulated: prompts are counted as they count them.
        self.runtime: Runtime = build_runtime(
            cfg.model_copy(update={"keys": (), "tokenizer": "simulator"}), Metrics()
        )
        self.key = key or open_key()
        self.decisions: dict[str, Decision] = {}
        self.clients: dict[str, str] = {}  # request id → the X-Client-Id it carries
        self.gate = gate
        self.tenants: dict[str, Tenant] = {}  # request id → the key it waits as (with a gate)
        self._lanes: dict[str, Lane] = {}  # request id → its lane, while it holds a slot
        self._piece_bytes = sse_piece_bytes(cfg)
        # The engines' KV events on their way to the pools' views (a precise_prefix lane's).
        self.feed: KVFeed | None = None
        self.estimated = 0  # backends judged by approximation, over every placement
        self._count_estimates()

    def _count_estimates(self) -> None:
        """Precise lanes' balancers as the router builds them, counting estimated backends here."""
        for lane in self.runtime.lanes.values():
            if places_on_token_ids(lane.config.balance):
                hooks = BalanceHooks(cached_tokens=lane.pool.kv.cached_tokens, on_estimated=self._estimated)
                lane.balancer = make_balancer(lane.config.balance, hooks)

    def _estimated(self, n: int) -> None:
        self.estimated += n

    def _identity(self, request_id: str) -> str | None:
        client = self.clients.get(request_id)
        return None if client is None else client_identity(self.key.name, client.encode(), None)

    def observe_stream(self, request_id: str, stream: ReadStream, now: float) -> None:
        """A stream ended at `now`: remember its client as slow if the router would have seen it
        lag (only relays that are not already decoupled measure, as in the router)."""
        decision = self.decisions.get(request_id)
        identity = self._identity(request_id)
        if decision is None or identity is None:
            return
        if self.runtime.lanes[decision.lane].config.decouple:
            return
        lagged_at = first_lag(stream, self._piece_bytes, self.runtime.lag.lag_bytes)
        if lagged_at is not None:
            self.runtime.slow_clients.mark(identity, lagged_at)

    def finished(self, request_id: str, now: float) -> list[str]:
        """The request is done: with a gate, the ids of the waiters its slot now goes to."""
        if self.gate is None:
            return []
        self._lanes.pop(request_id, None)
        return self.gate.finished(request_id, now)

    def pick(self, states: Sequence[BackendState], req: TraceRequest) -> int | None:
        gate = self.gate
        if gate is not None and gate.holds(req.request_id):
            # A waiter that was handed a slot: placed now, as the router's waiter is.
            lane = self._lanes[req.request_id]
            return _place(lane, states, gate.affinity(req.request_id))
        if self.feed is not None:
            self.feed.advance(req.arrival)
        runtime = self.runtime
        rules = runtime.classify_rules
        try:
            facts = parse_facts("chat", orjson.dumps(req.body), runtime.counters)
            seen = 0
            fingerprint = facts.prefix_fingerprint(rules.repeated_prefix_tokens)
            if fingerprint is not None:
                seen = runtime.prefixes.observe(fingerprint, req.arrival)
            identity = self._identity(req.request_id)
            slow = (
                facts.stream
                and identity is not None
                and self.runtime.slow_clients.is_slow(identity, req.arrival)
            )
            decision = classify(facts, self.key, Signals(prefix_seen=seen, slow_client=slow), rules)
            self.key.allow_class(decision.cls)
        except RouterError:
            return None
        route = runtime.routes.get(facts.model)
        if route is None:
            return None  # the router answers 404 model_not_found
        lane = route.lanes[decision.cls]
        self.decisions[req.request_id] = Decision(
            decision.cls.value, decision.reason.value, lane.name, lane.pool.name
        )
        # The prompt's token ids for a lane that places on them, as the handler works them out.
        token_ids = engine_token_ids(route.counter, facts, None) if lane.settings.token_ids else ()
        affinity = affinity_for(lane, facts, runtime, None, token_ids)
        if gate is not None:
            tenant = self.tenants.get(req.request_id, ANONYMOUS)
            tokens = facts.prompt_tokens + (facts.max_tokens or 0)
            verdict = gate.arrive(req.request_id, lane, tenant, tokens, affinity, req.arrival)
            if verdict == "refused":
                return None
            self._lanes[req.request_id] = lane
            if verdict == "wait":
                return WAIT
        return _place(lane, states, affinity)


def _place(lane: Lane, states: Sequence[BackendState], affinity: Affinity) -> int | None:
    """The lane's balancer over its pool's backends."""
    candidates = [Seen.of(s) for s in states if s.pool == lane.pool.name]
    if not candidates:
        return None
    return lane.balancer.pick(candidates, affinity).index


def sse_piece_bytes(cfg: ProfileConfig) -> Callable[[int], int]:
    """Bytes of one streamed chat piece of n tokens as the simulator writes it (ids as the router
    forwards them: 16 hex digits)."""
    writer = ChunkWriter("chat", "chatcmpl-" + "0" * 16, pool_model(cfg), 1_700_000_000)
    base = len(writer.text(""))
    return lambda n: base + CHARS_PER_TOKEN * n


def pool_model(cfg: ProfileConfig) -> str:
    """The model the workload's clients ask for: the pool model most lanes serve."""
    models = [cfg.pools[lane.pool].model for lane in cfg.lanes.values()]
    return max(sorted(set(models)), key=models.count)
