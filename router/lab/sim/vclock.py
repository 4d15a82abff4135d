"""Virtual-clock simulation: whole profiles over a request trace, in seconds of CPU.

The same engines (scheduler, KV manager, timing model) as the real-time server, driven by a
discrete-event heap instead of sleeps. Routing is not simulated here: every arrival is placed
by a `pick(backends, request) -> index` function the caller passes in — the router's own pure
routing (classify → lane → pool → balance) behind a thin adapter, so results reflect the
router's real decisions. `BackendState` carries what the router sees of a backend: its name and
pool, the requests it has in flight, and the load vLLM reports on /metrics.
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from router.errors import RouterError
from router.lab.sim.config import EngineConfig
from router.lab.sim.engine import Engine, StepResult
from router.lab.sim.frontend import Frontend
from router.lab.sim.kv_events import KVEvent
from router.lab.sim.protocol import Kind, parse_generation
from router.lab.sim.request import EngineRequest, new_request
from router.lab.sim.timing import StepTimeModel


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace: when it arrives and the OpenAI body it sends."""

    request_id: str
    arrival: float
    body: Mapping[str, Any]
    kind: Kind = "chat"
    label: str = ""  # the workload's own class name, for reports only


@dataclass(frozen=True, slots=True)
class VirtualBackend:
    name: str
    pool: str
    config: EngineConfig
    timing: StepTimeModel
    served_model_names: tuple[str, ...] = ("sim-model",)


@dataclass(slots=True)
class BackendState:
    """A backend as the router sees it when a request arrives."""

    index: int
    name: str
    pool: str
    in_flight: int
    num_running: int
    num_waiting: int
    kv_cache_usage: float

    @property
    def load_score(self) -> float:
        return self.in_flight + self.num_waiting + self.kv_cache_usage


PickFn = Callable[[Sequence[BackendState], TraceRequest], int | None]
# What a pick function returns for a request that waits at the router: it stays open until the
# caller `release`s it (picked again then) or `refuse`s it.
WAIT = -1
# Called once per request when its outcome is final (answered, refused or rejected), with the
# virtual time; returns follow-up requests to add (e.g. an agent's next step after think time).
DoneFn = Callable[["RequestRecord", float], Iterable[TraceRequest]]


class Membership:
    """Who is in the fleet, for a caller following it (the router's view of its engines' caches):
    `published(index, events, at)` after each engine step with KV events, `joined(index, at)` when
    a backend joins (a fresh engine, its cache empty), `left(index, at)` when it leaves."""

    def published(self, index: int, events: list[KVEvent], at: float) -> None:
        pass

    def joined(self, index: int, at: float) -> None:
        pass

    def left(self, index: int, at: float) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Change:
    """Backend `index` joins (`up`) or leaves the fleet at `at`. A backend that leaves takes no
    new request and finishes those it holds; one that joins starts a fresh engine (an empty
    cache) unless its old one still has requests to finish."""

    at: float
    index: int
    up: bool


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    label: str
    arrival: float
    backend: int | None = None
    status: int = 200  # HTTP status the client got; 0 = the pick function refused it
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    first_token: float | None = None
    # From the engine core's queueing of the request to its first token (vLLM's queue time plus
    # prefill time): the first-token latency without the API server's part.
    engine_ttft: float | None = None
    # The engine core takes new requests between steps: the step under way when this request
    # reached it, and how much of that step was left.
    step_under_way: float = 0.0
    step_left: float = 0.0
    finish: float | None = None
    finish_reason: str | None = None
    itl: array[float] = field(default_factory=lambda: array("d"))
    _last_emit: float = 0.0
    _pending: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def e2e(self) -> float | None:
        return None if self.finish is None else self.finish - self.arrival


@dataclass(frozen=True, slots=True)
class BackendSummary:
    name: str
    pool: str
    steps: int
    busy_time: float
    prefix_queries: int
    prefix_hits: int
    preemptions: int
    generated_tokens: int
    blocks_per_sequence: float
    spans_per_sequence: float


@dataclass(frozen=True, slots=True)
class SimulationResult:
    records: list[RequestRecord]
    backends: list[BackendSummary]
    end_time: float


_ARRIVE, _ENQUEUE, _STEP_END, _HANDED, _CHANGE = 0, 1, 2, 3, 4


class VirtualCluster:
    def __init__(
        self,
        backends: Sequence[VirtualBackend],
        *,
        scrape_interval: float = 0.0,
        members: Membership | None = None,
        changes: Sequence[Change] = (),
        absent: Iterable[int] = (),
    ) -> None:
        """`members`: told of every engine's KV events (engines then report them) and of
        membership; `changes`: backends joining and leaving during the run; `absent`: backends
        not in the fleet at the start (a later change brings them in)."""
        if not backends:
            raise ValueError("at least one backend")
        self.backends = list(backends)
        self.members = members
        self.engines = [self._engine(b) for b in backends]
        self._retired: list[list[Engine]] = [[] for _ in backends]
        self.active = [True] * len(backends)
        for i in absent:
            self.active[i] = False
        self._changes = list(changes)
        self.frontends = [Frontend(b.timing) for b in backends]
        self.scrape_interval = scrape_interval
        self._in_flight = [0] * len(backends)
        self._scraped = [(0, 0, 0.0)] * len(backends)
        self._scraped_at = float("-inf")
        self._busy = [False] * len(backends)
        self._step_span = [(0.0, 0.0)] * len(backends)
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self._records: list[RequestRecord] = []
        self._on_done: DoneFn | None = None
        self._held: dict[str, tuple[TraceRequest, RequestRecord]] = {}

    # ---- public ------------------------------------------------------------------------------
    def run(
        self, trace: Sequence[TraceRequest], pick: PickFn, on_done: DoneFn | None = None
    ) -> SimulationResult:
        """Simulate `trace`; `on_done` may add requests as others finish (closed-loop clients)."""
        self._on_done = on_done
        records = self._records = []
        for change in self._changes:  # first: a change at t holds for arrivals at t
            self._push(change.at, _CHANGE, change)
        for t in trace:
            self._add(t)
        if self.members is not None:
            for i, up in enumerate(self.active):
                if up:
                    self.members.joined(i, 0.0)
        now = 0.0
        while self._heap:
            now, _, kind, payload = heapq.heappop(self._heap)
            if kind == _ARRIVE:
                self._arrive(now, payload[0], payload[1], pick)
            elif kind == _ENQUEUE:
                self._enqueue(now, *payload)
            elif kind == _STEP_END:
                self._step_end(payload[0], payload[1])
            elif kind == _CHANGE:
                self._change(payload, now)
            else:
                self._deliver(payload[0], payload[1], now)
        return SimulationResult(records, [self._summary(i) for i in range(len(self.engines))], now)

    def release(self, request_id: str, at: float) -> None:
        """A request that waited (`WAIT`) arrives at the pick function again at `at`."""
        self._push(at, _ARRIVE, self._held.pop(request_id))

    def refuse(self, request_id: str, status: int, at: float) -> None:
        """A request that waited (`WAIT`) is answered `status` at `at` without reaching an engine."""
        _, rec = self._held.pop(request_id)
        rec.status = status
        self._done(rec, at)

    def states(self, now: float) -> list[BackendState]:
        if now - self._scraped_at >= self.scrape_interval:
            self._scraped = [(e.num_running, e.num_waiting, e.kv_usage) for e in self.engines]
            self._scraped_at = now
        states = []
        for i, b in enumerate(self.backends):
            if not self.active[i]:
                continue
            running, waiting, kv_usage = self._scraped[i]
            states.append(
                BackendState(
                    index=i,
                    name=b.name,
                    pool=b.pool,
                    in_flight=self._in_flight[i],
                    num_running=running,
                    num_waiting=waiting,
                    kv_cache_usage=kv_usage,
                )
            )
        return states

    # ---- membership --------------------------------------------------------------------------
    def _engine(self, b: VirtualBackend) -> Engine:
        return Engine(b.config, b.timing, kv_events=self.members is not None)

    def _change(self, change: Change, now: float) -> None:
        i = change.index
        if change.up == self.active[i]:
            return
        self.active[i] = change.up
        members = self.members
        if not change.up:
            if members is not None:
                members.left(i, now)
            return
        if not self.engines[i].has_work and not self._busy[i]:
            # A restarted engine: its counters are kept for the run's summary, its cache is gone.
            self._retired[i].append(self.engines[i])
            self.engines[i] = self._engine(self.backends[i])
            self.frontends[i] = Frontend(self.backends[i].timing)
        if members is not None:
            members.joined(i, now)

    # ---- events ------------------------------------------------------------------------------
    def _push(self, t: float, kind: int, payload: Any) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, payload))

    def _add(self, t: TraceRequest) -> None:
        rec = RequestRecord(t.request_id, t.label, t.arrival)
        self._records.append(rec)
        self._push(t.arrival, _ARRIVE, (t, rec))

    def _done(self, rec: RequestRecord, now: float) -> None:
        if self._on_done is not None:
            for follow_up in self._on_done(rec, now):
                self._add(follow_up)

    def _arrive(self, now: float, t: TraceRequest, rec: RequestRecord, pick: PickFn) -> None:
        index = pick(self.states(now), t)
        if index == WAIT:
            self._held[t.request_id] = (t, rec)
            return
        if index is None:
            rec.status = 0
            self._done(rec, now)
            return
        backend, engine = self.backends[index], self.engines[index]
        rec.backend = index
        try:
            parsed = parse_generation(
                t.body,
                t.kind,
                served_models=backend.served_model_names,
                max_model_len=engine.config.max_model_len,
                priority_enabled=engine.config.scheduling_policy == "priority",
            )
        except RouterError as err:
            rec.status = err.status
            self._done(rec, now)
            return
        req = new_request(
            t.request_id,
            parsed.prompt_token_ids,
            max_tokens=parsed.max_tokens,
            min_tokens=parsed.min_tokens,
            ignore_eos=parsed.ignore_eos,
            seed=parsed.seed,
            priority=parsed.priority,
            arrival_time=now,
        )
        rec.prompt_tokens = req.num_prompt_tokens
        req.handle = rec
        self._in_flight[index] += 1
        self._push(self.frontends[index].admit(now, req.num_prompt_tokens), _ENQUEUE, (index, req))

    def _enqueue(self, now: float, index: int, req: EngineRequest) -> None:
        try:
            self.engines[index].add_request(req, now)
        except RouterError as err:
            rec: RequestRecord = req.handle
            rec.status = err.status
            self._in_flight[index] -= 1
            self._done(rec, now)
            return
        if self._busy[index]:
            rec = req.handle
            start, end = self._step_span[index]
            rec.step_under_way, rec.step_left = end - start, end - now
        else:
            self._start_step(index, now)

    def _start_step(self, index: int, now: float) -> None:
        engine = self.engines[index]
        result = engine.step(now)
        if engine.kv_events is not None and self.members is not None:
            events = engine.kv_events.take()
            if events:
                # vLLM publishes a step's events once the step's output is processed.
                self.members.published(index, events, now if result is None else result.end)
        if result is None:
            self._busy[index] = False
            return
        self._busy[index] = True
        self._step_span[index] = (result.start, result.end)
        self._push(result.end, _STEP_END, (index, result))

    def _step_end(self, index: int, result: StepResult) -> None:
        t = result.end
        handed = self.frontends[index].emit(t, len(result.outputs))
        if handed > t:
            self._push(handed, _HANDED, (index, result))
        else:
            self._deliver(index, result, t)
        self._start_step(index, t)

    def _deliver(self, index: int, result: StepResult, t: float) -> None:
        """The step's tokens reach their clients at `t`, after the API server passed them on."""
        interval = self.engines[index].config.stream_interval
        ended = set(result.finished) if result.finished else ()
        for req in result.outputs:
            rec: RequestRecord = req.handle
            rec._pending += 1
            done = req in ended
            if rec.first_token is None:
                rec.first_token = rec._last_emit = t
                rec._pending = 0
                if req.first_token_time is not None:
                    rec.engine_ttft = req.first_token_time - req.queued_time
            elif done or rec._pending >= interval:
                rec.itl.append(t - rec._last_emit)
                rec._last_emit = t
                rec._pending = 0
        for req in result.finished:
            rec = req.handle
            rec.finish = t
            rec.finish_reason = req.finish_reason
            rec.output_tokens = req.num_output_tokens
            rec.cached_tokens = req.num_cached_tokens
            self._in_flight[index] -= 1
            self._done(rec, t)

    def _summary(self, i: int) -> BackendSummary:
        e, b = self.engines[i], self.backends[i]
        lives = [*self._retired[i], e]  # every engine that served under this name
        return BackendSummary(
            name=b.name,
            pool=b.pool,
            steps=sum(x.steps for x in lives),
            busy_time=sum(x.busy_time for x in lives),
            prefix_queries=sum(x.scheduler.prefix_queries for x in lives),
            prefix_hits=sum(x.scheduler.prefix_hits for x in lives),
            preemptions=sum(x.scheduler.preemptions for x in lives),
            generated_tokens=sum(x.metrics.generation_tokens for x in lives),
            blocks_per_sequence=e.blocks_per_sequence,
            spans_per_sequence=e.spans_per_sequence,
        )


def simulate(
    backends: Sequence[VirtualBackend],
    trace: Sequence[TraceRequest],
    pick: PickFn,
    *,
    scrape_interval: float = 0.0,
    on_done: DoneFn | None = None,
) -> SimulationResult:
    """Run `trace` through fresh engines; `pick` places each arrival on a backend; `on_done`
    may add follow-up requests as requests finish."""
    return VirtualCluster(backends, scrape_interval=scrape_interval).run(trace, pick, on_done)
