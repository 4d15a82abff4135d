"""Markdown for comparisons: the side-by-side table per offered load, the capacity table, and
report.md around them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from router.lab.bench.compare import Comparison, Point
from router.lab.bench.report import ClassStats, RunStats


def _pct(x: float) -> str:
    return "–" if math.isnan(x) else f"{x * 100:.1f} %"


def _s(x: float) -> str:
    if math.isnan(x):
        return "–"
    return f"{x * 1e3:.0f} ms" if x < 1 else f"{x:.2f} s"


def _cell(c: ClassStats | None) -> str:
    if c is None or not c.sent:
        return "–"
    # The bound that matters for the class: TTFT for streams, end-to-end for the rest.
    streamed = not math.isnan(c.itl.p95)
    key = _s(c.ttft.p95) if streamed else _s(c.e2e.p95)
    mark = "" if c.passed else " ✗"
    return f"{_pct(c.attainment)}{mark} ({key})"


def side_by_side(c: Comparison, rate: float) -> str:
    points: list[Point | None] = [c.point(name, rate) for name in c.profiles]
    head = "| class | " + " | ".join(c.profiles) + " |"
    lines = [head, "|" + "---|" * (len(c.profiles) + 1)]
    for name in c.workload.class_names():
        cells = [_cell(p.stats.classes.get(name)) if p else "–" for p in points]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    def row(label: str, fn: Callable[[RunStats], str]) -> None:
        cells = ["–" if p is None else fn(p.stats) for p in points]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row("goodput req/s", lambda s: f"{s.goodput:.2f}")
    row("accepted", lambda s: _pct(s.accepted_share))
    row("output tokens/s", lambda s: f"{s.output_tokens_per_s:,.0f}")
    row("**gate**", lambda s: "**PASS**" if s.passed else "FAIL")
    return "\n".join(lines)


def pool_table(c: Comparison, rate: float) -> str:
    """Engines per pool and how busy they were (virtual runs), one row per profile."""
    lines = ["| profile | pools: engines × busy share (prefix-cache hit rate) |", "|---|---|"]
    for name in c.profiles:
        point = c.point(name, rate)
        if point is None or not point.pools:
            continue
        cells = ", ".join(
            f"{pool} {u.engines} × {u.busy * 100:.0f} % ({u.prefix_hit_rate * 100:.0f} %)"
            for pool, u in point.pools.items()
        )
        lines.append(f"| {name} | {cells} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def capacity_table(c: Comparison) -> str:
    lines = [
        "| profile | highest passing load req/s | goodput there req/s | SLO met there | accepted there "
        "| first failing load | classes failing there |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in c.profiles:
        rate, point = c.capacity(name)
        failing = _first_failure(c, name, rate)
        fail_rate = f"{failing.rate:g}" if failing else "–"
        fail_classes = ", ".join(failing.stats.failing()) if failing else "–"
        if point is None:
            lines.append(f"| {name} | none of {_rates(c)} | – | – | – | {fail_rate} | {fail_classes} |")
            continue
        s: RunStats = point.stats
        lines.append(
            f"| {name} | {rate:g} | {s.goodput:.2f} | {_pct(s.attainment)} | {_pct(s.accepted_share)} "
            f"| {fail_rate} | {fail_classes} |"
        )
    return "\n".join(lines)


def _length(c: Comparison) -> str:
    if c.spec.requests is not None:
        return f"about {c.spec.requests:,} requests"
    return f"{c.spec.duration_at(1.0):g} s of arrivals"


def _rates(c: Comparison) -> str:
    return ", ".join(f"{r:g}" for r in c.spec.rates)


def _first_failure(c: Comparison, profile: str, above: float | None) -> Point | None:
    floor = -math.inf if above is None else above
    failing = [p for p in c.points if p.profile == profile and not p.stats.passed and p.rate > floor]
    return min(failing, key=lambda p: p.rate) if failing else None


def report_md(c: Comparison, plots: Sequence[str], command: str) -> str:
    spec = c.spec
    parts = [
        f"# Mixed-traffic comparison: {', '.join(c.profiles)}",
        "",
        f"Workload `{c.workload.name}` (seed {spec.seed if spec.seed is not None else c.workload.seed}), "
        f"{spec.mode} mode, preset `{spec.preset}`, "
        f"{spec.engines if spec.engines is not None else 'the profiles’'} engines, "
        f"{_length(c)} per point, offered loads {_rates(c)} req/s."
        + (
            " Profile settings changed for this run: " + ", ".join(f"`{k}={v}`" for k, v in spec.sets) + "."
            if spec.sets
            else ""
        ),
        "",
        "```",
        command,
        "```",
        "",
        "## Capacity: the highest offered load that passes the gate",
        "",
        capacity_table(c),
        "",
    ]
    for rate in spec.rates:
        parts += [
            f"## At {rate:g} req/s",
            "",
            "Per class: share of requests meeting the class SLO (✗ below the gate), with p95 TTFT "
            "for streamed classes or p95 end-to-end time for the others.",
            "",
            side_by_side(c, rate),
            "",
            pool_table(c, rate),
            "",
        ]
    if plots:
        parts += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    return "\n".join(parts)
