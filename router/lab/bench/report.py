"""Report math: percentiles, SLO attainment, goodput and the gate, from request outcomes. Pure.

Definitions (stated once, used by every table, plot and record):

* percentile — nearest rank: the smallest value with at least q % of the values at or below it.
  So "p95 ≤ bound" holds exactly when at least 95 % of the values are within the bound.
* a request *meets its class SLO* when it was answered 200 without error and every bound its
  class sets holds: TTFT, its own `itl_percentile` inter-token gap, end-to-end time.
* attainment — met / sent, per class; rejected and failed requests count as missed.
* goodput — requests that met their SLO per second of the offered window (the arrival period);
  accepted rate likewise for answered requests.
* output tokens/s — output tokens of answered requests over the span from the start of the run
  to the last answer.
* gate — every class with requests reaches its attainment threshold.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from router.lab.bench.outcome import Outcome
from router.lab.bench.workload import Gate, Slo, WorkloadSpec

QUANTILES = (50.0, 95.0, 99.0)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of `values` (NaN when empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def meets_slo(o: Outcome, slo: Slo) -> bool:
    if not o.ok:
        return False
    if slo.ttft_s is not None and (o.ttft is None or o.ttft > slo.ttft_s):
        return False
    if slo.itl_s is not None and o.gaps and percentile(o.gaps, slo.itl_percentile) > slo.itl_s:
        return False
    return not (slo.e2e_s is not None and (o.e2e is None or o.e2e > slo.e2e_s))


@dataclass(frozen=True, slots=True)
class Spread:
    p50: float
    p95: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        ordered = sorted(values)
        return cls(*(percentile(ordered, q) for q in QUANTILES))


@dataclass(frozen=True, slots=True)
class ClassStats:
    cls: str
    sent: int
    answered: int
    met: int
    threshold: float
    ttft: Spread
    itl: Spread
    e2e: Spread
    output_tokens: int
    goodput: float
    accepted_rate: float
    lanes: dict[str, int] = field(default_factory=dict)

    @property
    def attainment(self) -> float:
        return self.met / self.sent if self.sent else math.nan

    @property
    def accepted_share(self) -> float:
        return self.answered / self.sent if self.sent else math.nan

    @property
    def passed(self) -> bool:
        return self.sent > 0 and self.attainment >= self.threshold


@dataclass(frozen=True, slots=True)
class RunStats:
    window: float
    span: float
    classes: dict[str, ClassStats]

    @property
    def sent(self) -> int:
        return sum(c.sent for c in self.classes.values())

    @property
    def met(self) -> int:
        return sum(c.met for c in self.classes.values())

    @property
    def goodput(self) -> float:
        return self.met / self.window if self.window > 0 else math.nan

    @property
    def accepted_share(self) -> float:
        sent = self.sent
        return sum(c.answered for c in self.classes.values()) / sent if sent else math.nan

    @property
    def attainment(self) -> float:
        sent = self.sent
        return self.met / sent if sent else math.nan

    @property
    def output_tokens_per_s(self) -> float:
        tokens = sum(c.output_tokens for c in self.classes.values())
        return tokens / self.span if self.span > 0 else math.nan

    @property
    def passed(self) -> bool:
        """The gate: every class that had requests met its SLO often enough."""
        present = [c for c in self.classes.values() if c.sent]
        return bool(present) and all(c.passed for c in present)

    def failing(self) -> list[str]:
        return [c.cls for c in self.classes.values() if c.sent and not c.passed]


def class_stats(
    cls: str, outcomes: Sequence[Outcome], slo: Slo, threshold: float, window: float
) -> ClassStats:
    answered = [o for o in outcomes if o.ok]
    met = sum(1 for o in outcomes if meets_slo(o, slo))
    lanes: dict[str, int] = {}
    for o in outcomes:
        lane = o.lane or "-"
        lanes[lane] = lanes.get(lane, 0) + 1
    return ClassStats(
        cls=cls,
        sent=len(outcomes),
        answered=len(answered),
        met=met,
        threshold=threshold,
        ttft=Spread.of([o.ttft for o in answered if o.ttft is not None]),
        itl=Spread.of([g for o in answered for g in o.gaps]),
        e2e=Spread.of([o.e2e for o in answered if o.e2e is not None]),
        output_tokens=sum(o.output_tokens for o in answered),
        goodput=met / window if window > 0 else math.nan,
        accepted_rate=len(answered) / window if window > 0 else math.nan,
        lanes=dict(sorted(lanes.items())),
    )


def summarize(
    outcomes: Iterable[Outcome], workload: WorkloadSpec, window: float, gate: Gate | None = None
) -> RunStats:
    """Per-class statistics of one run; `window` is the offered (arrival) period in seconds."""
    gate = gate or workload.gate
    by_class: dict[str, list[Outcome]] = {name: [] for name in workload.class_names()}
    span = 0.0
    for o in outcomes:
        by_class.setdefault(o.cls, []).append(o)
        if o.finish is not None:
            span = max(span, o.finish)
    classes = {
        name: class_stats(name, items, workload.spec(name).slo, gate.threshold(name), window)
        for name, items in by_class.items()
    }
    return RunStats(window=window, span=max(span, window), classes=classes)


def _ms(x: float) -> str:
    return "–" if math.isnan(x) else f"{x * 1e3:,.0f}"


def _pct(x: float) -> str:
    return "–" if math.isnan(x) else f"{x * 100:.1f} %"


def class_table(stats: RunStats) -> str:
    """A markdown table, one row per class, then the whole run."""
    head = (
        "| class | sent | accepted | TTFT p50/p95/p99 ms | ITL p50/p95/p99 ms | e2e p50/p95/p99 ms "
        "| SLO met | goodput req/s | gate |"
    )
    lines = [head, "|" + "---|" * 9]
    for c in stats.classes.values():
        if not c.sent:
            continue
        lines.append(
            f"| {c.cls} | {c.sent} | {_pct(c.accepted_share)} "
            f"| {_ms(c.ttft.p50)} / {_ms(c.ttft.p95)} / {_ms(c.ttft.p99)} "
            f"| {_ms(c.itl.p50)} / {_ms(c.itl.p95)} / {_ms(c.itl.p99)} "
            f"| {_ms(c.e2e.p50)} / {_ms(c.e2e.p95)} / {_ms(c.e2e.p99)} "
            f"| {_pct(c.attainment)} | {c.goodput:.2f} | {'pass' if c.passed else 'FAIL'} |"
        )
    lines.append(
        f"| **all** | {stats.sent} | {_pct(stats.accepted_share)} | | | | {_pct(stats.attainment)} "
        f"| {stats.goodput:.2f} | {'PASS' if stats.passed else 'FAIL'} |"
    )
    return "\n".join(lines)


def routing_table(stats: RunStats) -> str:
    """Which lanes each class's requests were sent down, with counts."""
    lines = ["| class | lanes |", "|---|---|"]
    for c in stats.classes.values():
        if c.sent:
            lanes = ", ".join(f"{lane} {n}" for lane, n in c.lanes.items())
            lines.append(f"| {c.cls} | {lanes} |")
    return "\n".join(lines)
