"""The `lane_router_*` metric families on the router's own registry.

Labels stay bounded: class, lane, pool, backend, status and reason — never keys or request ids.
A pool found by discovery has at most `discovery.max_backends` members, and a backend's series
are removed once it has left the pool and drained (router/fleet/fleet.py), so the backend label has
at most that many values per pool, plus the few still draining.
One `Metrics` lives for the whole process, across profile reloads, so counters never reset when
a profile is swapped."""

from __future__ import annotations

from typing import Final

from mypy_extensions import mypyc_attr
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from router.observe.leanmetrics import CounterValue, GaugeValue, counter, gauge, histogram

CONTENT_TYPE: Final = CONTENT_TYPE_LATEST

LATENCY_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    8.0,
    12.0,
    20.0,
    30.0,
    60.0,
    120.0,
)
ITL_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.015,
    0.02,
    0.03,
    0.04,
    0.05,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    1.0,
    2.0,
)
_ROUTE: Final = ("class", "lane", "pool")


# Subclassed by a worker's registry (router/supervisor/workermetrics.py), which is not compiled
# (docs/compiled.md).
@mypyc_attr(allow_interpreted_subclasses=True)
class Metrics:
    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        p = "lane_router_"
        # What every request or streamed chunk touches is lock-free (router/observe/leanmetrics.py).
        self.requests = counter(
            p + "requests",
            "Requests answered, by class, lane, pool and HTTP status.",
            [*_ROUTE, "status"],
            registry,
        )
        self.ttft = histogram(
            p + "time_to_first_token_seconds",
            "Time from request arrival to the first response body byte.",
            _ROUTE,
            LATENCY_BUCKETS,
            registry,
        )
        self.itl = histogram(
            p + "inter_token_latency_seconds",
            "Gap between consecutive streamed chunks relayed to the client.",
            _ROUTE,
            ITL_BUCKETS,
            registry,
        )
        self.duration = histogram(
            p + "request_duration_seconds",
            "Time from request arrival to the last response byte.",
            _ROUTE,
            LATENCY_BUCKETS,
            registry,
        )
        self.queue_time = histogram(
            p + "queue_time_seconds",
            "Time a request waited for lane admission.",
            ["lane"],
            LATENCY_BUCKETS,
            registry,
        )
        self.in_flight = gauge(p + "in_flight", "Requests being proxied now.", ["lane", "pool"], registry)
        self.queue_waiting = gauge(
            p + "queue_waiting",
            "Requests waiting for room in a lane now (in this process), by the tier of their key.",
            ["lane", "tier"],
            registry,
        )
        self.queue_displaced = counter(
            p + "queue_displaced",
            "Waiting requests refused (503 queue_full) to give their place in a full lane to "
            "another key's: the newest of the key holding the most places for its weight.",
            ["lane"],
            registry,
        )
        self.backend_up = Gauge(
            p + "backend_up",
            "1 when the backend is in rotation, else 0.",
            ["pool", "backend"],
            registry=registry,
        )
        self.backend_drift = Gauge(
            p + "backend_config_drift",
            "1 when a live backend disagrees with its pool's declared configuration.",
            ["pool", "backend"],
            registry=registry,
        )
        self.upstream_errors = Counter(
            p + "upstream_errors",
            "Failed upstream attempts, by reason.",
            ["pool", "backend", "reason"],
            registry=registry,
        )
        self.retries = Counter(
            p + "retries",
            "Requests retried on another backend before the first byte.",
            ["pool"],
            registry=registry,
        )
        self.rejected = Counter(
            p + "rejected", "Requests refused by the router, by reason.", ["reason"], registry=registry
        )
        self.classified = counter(
            p + "classified",
            "Classification decisions, by class and signal.",
            ["class", "reason"],
            registry,
        )
        self.client_disconnects = Counter(
            p + "client_disconnects",
            "Clients that went away before the response ended.",
            [*_ROUTE, "phase"],
            registry=registry,
        )
        self.slow_clients = Counter(
            p + "slow_clients", "Streams whose client fell behind upstream.", ["lane"], registry=registry
        )
        self.stream_buffer_bytes = Gauge(
            p + "stream_buffer_bytes", "Bytes held for slow clients across all streams.", registry=registry
        )
        self.prefix_affinity_hits = Counter(
            p + "prefix_affinity_hits",
            "Requests sent to their prefix's preferred backend.",
            ["pool"],
            registry=registry,
        )
        self.precise_prefix_estimated = Counter(
            p + "precise_prefix_estimated",
            "Backends a precise_prefix placement judged by approximation: their KV event stream "
            "was not followed, not yet connected or lost.",
            ["pool"],
            registry=registry,
        )
        self.adapter_loads = Counter(
            p + "adapter_loads",
            "LoRA adapters the router loaded on a backend on demand, by pool and outcome (loaded, failed).",
            ["pool", "outcome"],
            registry=registry,
        )
        self.adapter_requests = Counter(
            p + "adapter_requests",
            "Requests naming a LoRA adapter, by pool and where they went: preferred (the first "
            "holder in the adapter's rank), spilled (another holder, the first being loaded past "
            "the bound), loaded (a backend the router loaded it on first).",
            ["pool", "placement"],
            registry=registry,
        )
        self.config_reloads = Counter(
            p + "config_reloads", "Profile reload attempts, by result.", ["result"], registry=registry
        )
        self.auth_failures = Counter(
            p + "auth_failures", "Requests refused for their key, by reason.", ["reason"], registry=registry
        )
        self.tls_handshake_failures = Counter(
            p + "tls_handshake_failures",
            "Client connections whose TLS handshake failed, by reason (handshake_timeout, plain_http, "
            "no_client_certificate, bad_client_certificate, protocol_mismatch, "
            "closed_during_handshake, handshake_failed).",
            ["reason"],
            registry=registry,
        )
        self.tls_certificate_reloads = Counter(
            p + "tls_certificate_reloads",
            "Re-reads of the listener's certificate files (SIGHUP), by result.",
            ["result"],
            registry=registry,
        )
        self.shared_state_errors = Counter(
            p + "shared_state_errors",
            "Operations on the replicas' shared state (Redis) that failed or were skipped while it "
            "was down, by operation and reason.",
            ["op", "reason"],
            registry=registry,
        )
        self.shared_slots_excess = Gauge(
            p + "shared_slots_excess",
            "Slots of a lane that other router processes held beyond their parts at this process's "
            "last look at Redis; its own part is reduced by them while Redis is unavailable.",
            ["lane"],
            registry=registry,
        )
        self.shared_slots_inexact = Counter(
            p + "shared_slots_inexact",
            "Times shared admission counts could not be kept exact: fallback (Redis unavailable; "
            "slots other processes took since the last look are not known), late_rehome (slots "
            "re-homed after Redis may have granted them again).",
            ["reason"],
            registry=registry,
        )
        self.discovery_errors = Counter(
            p + "discovery_errors",
            "Failed resolutions of a discovery pool's name, by reason (timeout, server_failure, "
            "nxdomain, no_addresses, error); the pool keeps its last good members meanwhile.",
            ["pool", "reason"],
            registry=registry,
        )
        self.discovery_truncated = Gauge(
            p + "discovery_truncated",
            "1 when a discovery pool's name has more addresses than discovery.max_backends "
            "(the lowest are used), else 0.",
            ["pool"],
            registry=registry,
        )
        self.prompt_counts = Counter(
            p + "prompt_counts",
            "Prompts of a model without a tokenizer whose byte bound and lower estimate fell on two "
            "sides of a decision, by how they were then counted: backend (the backends' /tokenize), "
            "byte_bound (no backend could count: the upper bound decided).",
            ["model", "how"],
            registry=registry,
        )
        # Requests judged against their lane's SLO (router/observe/slo.py), by lane and class.
        self.slo_met = counter(
            p + "slo_met",
            "Requests that met their lane's SLO, by lane and class.",
            ["lane", "class"],
            registry,
        )
        self.slo_missed = counter(
            p + "slo_missed",
            "Requests that missed their lane's SLO, by lane, class and the first bound missed "
            "(ttft, itl, e2e), or failed (429 or 5xx).",
            ["lane", "class", "missed"],
            registry,
        )

        self._routes: dict[tuple[str, str, str], RouteMetrics] = {}

    def route(self, cls: str, lane: str, pool: str) -> RouteMetrics:
        """The children of one class × lane × pool, bound once: `labels()` costs more than the
        observation itself, and the hot path observes several per request."""
        key = (cls, lane, pool)
        found = self._routes.get(key)
        if found is None:
            found = self._routes[key] = RouteMetrics(self, key)
        return found

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class RouteMetrics:
    __slots__ = (
        "_disconnects",
        "_metrics",
        "_requests",
        "_slo",
        "classified",
        "duration",
        "in_flight",
        "itl",
        "key",
        "ttft",
    )

    def __init__(self, metrics: Metrics, key: tuple[str, str, str]) -> None:
        _, lane, pool = key
        self._metrics = metrics
        self.key = key
        self.ttft = metrics.ttft.labels(*key)
        self.itl = metrics.itl.labels(*key)
        self.duration = metrics.duration.labels(*key)
        self.in_flight = metrics.in_flight.labels(lane, pool)
        # By the status as the relay has it: an HTTP status as a number, spelled out only for
        # the label of its first request.
        self._requests: dict[int | str, CounterValue] = {}
        self._disconnects: dict[str, Counter] = {}
        # The SLO verdicts' children, by verdict ("" for met), made at their first request.
        self._slo: dict[str, CounterValue] = {}

    def request_done(self, status: int | str) -> None:
        child = self._requests.get(status)
        if child is None:
            child = self._requests[status] = self._metrics.requests.labels(*self.key, str(status))
        child.inc()

    def disconnected(self, phase: str) -> None:
        child = self._disconnects.get(phase)
        if child is None:
            child = self._disconnects[phase] = self._metrics.client_disconnects.labels(*self.key, phase)
        child.inc()

    def slo_judged(self, verdict: str | None) -> None:
        """Count a request's SLO verdict (router/observe/slo.py): "" met, else the bound it
        missed; None is not counted."""
        if verdict is None:
            return
        child = self._slo.get(verdict)
        if child is None:
            cls, lane, _ = self.key
            if verdict:
                child = self._metrics.slo_missed.labels(lane, cls, verdict)
            else:
                child = self._metrics.slo_met.labels(lane, cls)
            self._slo[verdict] = child
        # Its value, not inc(): a call fewer on every request, and the amount is never negative.
        child.value += 1.0


class LaneQueueMetrics:
    """A lane's queue series: what waits, by key tier (the profile's tiers bound the label), and
    the waiters displaced. Touched only by requests that wait."""

    __slots__ = ("_lane", "_metrics", "_waiting", "displaced")

    def __init__(self, metrics: Metrics, lane: str) -> None:
        self._metrics = metrics
        self._lane = lane
        self._waiting: dict[int, GaugeValue] = {}
        self.displaced = metrics.queue_displaced.labels(lane)

    def waiting(self, tier: int) -> GaugeValue:
        child = self._waiting.get(tier)
        if child is None:
            child = self._waiting[tier] = self._metrics.queue_waiting.labels(self._lane, str(tier))
        return child
