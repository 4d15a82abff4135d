"""What the peers benchmark measures, and what one measurement yields.

Every scenario is a closed loop of C connections against one fake backend for a fixed time; a
"chunk" is one SSE token event (the final `data: [DONE]` is not counted)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

# The fake backend's model (router.lab.bench.zero_backend.MODEL), named here so the load
# generator, started once per load, need not import the backend's ASGI stack.
MODEL = "fake-model"


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    title: str
    stream: bool
    concurrency: int
    tokens: int
    paced: bool  # against the backend with 20 ms to the first token and 5 ms between tokens
    stagger_ms: float = 0.0  # spread of the connections' first requests (no lockstep bursts)


# One paced stream lasts 20 + 63 × 5 = 335 ms: staggering the first requests over that keeps
# the 64 closed-loop streams from starting together every round.
PACED_STREAM_MS = 335.0
SCENARIOS: dict[str, Scenario] = {
    "nonstream": Scenario(
        name="nonstream", title="non-streamed, c=32", stream=False, concurrency=32, tokens=16, paced=False
    ),
    "stream": Scenario(
        name="stream",
        title="streamed 64 tok, zero delay, c=32",
        stream=True,
        concurrency=32,
        tokens=64,
        paced=False,
    ),
    "paced": Scenario(
        name="paced",
        title="paced 20 ms TTFT + 5 ms ITL, 64 streams",
        stream=True,
        concurrency=64,
        tokens=64,
        paced=True,
        stagger_ms=PACED_STREAM_MS,
    ),
}


@dataclass(frozen=True, slots=True)
class Load:
    """What the client saw: completed requests, token events, errors, TTFT percentiles (ms)."""

    requests: int
    chunks: int
    errors: int
    bad_counts: int  # streams that did not deliver exactly the tokens asked for
    elapsed_s: float
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    client: str = "loadgen"


@dataclass(frozen=True, slots=True)
class Measure:
    """One scenario through one target: the load and the proxy's CPU seconds, and of those the
    seconds in its own code rather than the kernel's (None: no proxy)."""

    load: Load
    proxy_cpu_s: float | None
    proxy_user_s: float | None = None
    window: tuple[float, float] = (0.0, 0.0)  # the harness's monotonic clock around the load

    @property
    def req_s(self) -> float:
        return self.load.requests / self.load.elapsed_s if self.load.elapsed_s else 0.0

    @property
    def chunks_s(self) -> float:
        return self.load.chunks / self.load.elapsed_s if self.load.elapsed_s else 0.0

    @property
    def us_per_request(self) -> float | None:
        return _micros_each(self.proxy_cpu_s, self.load.requests)

    @property
    def us_per_chunk(self) -> float | None:
        return _micros_each(self.proxy_cpu_s, self.load.chunks)

    @property
    def user_us_per_request(self) -> float | None:
        return _micros_each(self.proxy_user_s, self.load.requests)

    @property
    def user_us_per_chunk(self) -> float | None:
        return _micros_each(self.proxy_user_s, self.load.chunks)

    @property
    def core_pct(self) -> float | None:
        if self.proxy_cpu_s is None or not self.load.elapsed_s:
            return None
        return 100 * self.proxy_cpu_s / self.load.elapsed_s


def _micros_each(seconds: float | None, count: int) -> float | None:
    """`seconds` of CPU in µs per one of `count` (None: no proxy, or nothing counted)."""
    if seconds is None or not count:
        return None
    return 1e6 * seconds / count


def combined(rounds: list[Measure]) -> Measure:
    """The rounds of one scenario through one target as one measurement: counts, time and CPU
    summed (so per-request and per-chunk figures are over all rounds), TTFT percentiles the
    median of the rounds'."""
    loads = [m.load for m in rounds]
    cpu = [m.proxy_cpu_s for m in rounds]
    load = Load(
        requests=sum(x.requests for x in loads),
        chunks=sum(x.chunks for x in loads),
        errors=sum(x.errors for x in loads),
        bad_counts=sum(x.bad_counts for x in loads),
        elapsed_s=sum(x.elapsed_s for x in loads),
        ttft_p50_ms=_median([x.ttft_p50_ms for x in loads]),
        ttft_p99_ms=_median([x.ttft_p99_ms for x in loads]),
        client=loads[0].client,
    )
    user = [m.proxy_user_s for m in rounds]
    window = (min(m.window[0] for m in rounds), max(m.window[1] for m in rounds))
    return Measure(load, _total(cpu), _total(user), window)


def _total(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


@dataclass(frozen=True, slots=True)
class TargetResult:
    """One target over the scenarios run: each scenario's rounds and, `measures`, all of them
    `combined`; `missing` says why it was not run (e.g. not installed) or stopped."""

    label: str
    rounds: dict[str, list[Measure]]
    missing: str | None = None

    @property
    def measures(self) -> dict[str, Measure]:
        return {name: combined(ms) for name, ms in self.rounds.items() if ms}
