"""PNG plots of a comparison (matplotlib, Agg backend, from the `lab` extra):

* TTFT CDF per class, one line per profile, at one offered load;
* SLO attainment per class, one bar per profile, at one offered load, with the gate line;
* goodput against offered load, one line per profile (pass points filled, fail points hollow);
* per tenant of a shared lane, SLO attainment and TTFT p95, one bar per queueing mode;
* per prefix scenario, hit rate, TTFT p95 and goodput, one bar per balance strategy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from router.lab.bench.compare import Comparison

if TYPE_CHECKING:
    from router.lab.bench.prefix import StrategyRun
    from router.lab.bench.tenants import ModeRun
    from router.lab.bench.workload import WorkloadSpec


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _ticker() -> Any:
    from matplotlib import ticker

    return ticker


def ttft_cdf(c: Comparison, rate: float, path: Path) -> Path:
    plt = _pyplot()
    ticker = _ticker()
    classes = c.workload.class_names()
    cols = 3
    rows = math.ceil(len(classes) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, name in zip(axes.flat, classes, strict=False):
        slo = c.workload.spec(name).slo
        bound = slo.ttft_s if slo.ttft_s is not None else slo.e2e_s
        for profile in c.profiles:
            point = c.point(profile, rate)
            values = point.ttft_quantiles.get(name, []) if point else []
            if values:
                ys = [(i + 1) / len(values) for i in range(len(values))]
                ax.step(values, ys, where="post", label=profile)
        if bound is not None:
            ax.axvline(bound, color="grey", linestyle="--", linewidth=1)
        streamed = c.workload.spec(name).stream
        ax.set_title(f"{name} ({'TTFT' if streamed else 'latency, not streamed'})")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())  # minor labels collide on short ranges
        ax.set_xlabel("seconds")
        ax.set_ylabel("share of answered requests")
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(classes) :]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"Time to first token by class at {rate:g} req/s (dashed: the class bound)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def attainment_bars(c: Comparison, rate: float, path: Path) -> Path:
    plt = _pyplot()
    classes = c.workload.class_names()
    n = len(c.profiles)
    width = 0.8 / max(1, n)
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(classes) + 2) + 2.5, 4.5))
    for j, profile in enumerate(c.profiles):
        point = c.point(profile, rate)
        heights = []
        for name in classes:
            stats = point.stats.classes.get(name) if point else None
            heights.append(0.0 if stats is None or not stats.sent else stats.attainment * 100)
        xs = [i + (j - (n - 1) / 2) * width for i in range(len(classes))]
        ax.bar(xs, heights, width=width, label=profile)
    ax.axhline(c.workload.gate.min_attainment * 100, color="black", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(classes)))
    ax.set_xticklabels(classes)
    ax.set_ylim(0, 105)
    ax.set_ylabel("requests meeting the class SLO (%)")
    ax.set_title(f"SLO attainment per class at {rate:g} req/s (dashed: the gate)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def goodput_curve(c: Comparison, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.8))
    rates = sorted(set(c.spec.rates))
    ax.plot(rates, rates, color="lightgrey", linestyle=":", label="offered")
    for profile in c.profiles:
        points = [c.point(profile, r) for r in rates]
        xs = [p.rate for p in points if p]
        ys = [p.stats.goodput for p in points if p]
        line = ax.plot(xs, ys, marker="", label=profile)[0]
        for p in points:
            if p is None:
                continue
            face = line.get_color() if p.stats.passed else "white"
            ax.plot([p.rate], [p.stats.goodput], marker="o", color=line.get_color(), markerfacecolor=face)
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("goodput (requests/s meeting their SLO)")
    ax.set_title("Goodput against offered load (filled: the gate passes)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(c: Comparison, out_dir: Path, rate: float | None = None) -> list[Path]:
    """All three plots into `out_dir`; the per-load ones at `rate` (default: the highest load at
    which any profile passes, else the lowest load)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if rate is None:
        rate = pick_plot_rate(c)
    paths = [
        ttft_cdf(c, rate, out_dir / "ttft-cdf.png"),
        attainment_bars(c, rate, out_dir / "slo-attainment.png"),
    ]
    if len(set(c.spec.rates)) > 1:
        paths.append(goodput_curve(c, out_dir / "goodput-vs-load.png"))
    return paths


def pick_plot_rate(c: Comparison) -> float:
    passing = [p.rate for p in c.points if p.stats.passed]
    return max(passing) if passing else min(c.spec.rates)


def tenant_bars(workload: WorkloadSpec, rate: float, runs: Sequence[ModeRun], path: Path) -> Path:
    """Per tenant, one bar per mode: the share of its requests that met its SLO, and its TTFT p95."""
    plt = _pyplot()
    names = [t.name for t in workload.tenants]
    width = 0.8 / max(1, len(runs))
    fig, (met, ttft) = plt.subplots(1, 2, figsize=(12, 4.5))
    for j, run in enumerate(runs):
        xs = [i + (j - (len(runs) - 1) / 2) * width for i in range(len(names))]
        stats = [run.of(name) for name in names]
        met.bar(xs, [s.attainment * 100 for s in stats], width=width, label=run.mode)
        ttft.bar(
            xs, [0.0 if math.isnan(s.ttft_p95) else s.ttft_p95 for s in stats], width=width, label=run.mode
        )
    for ax in (met, ttft):
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names)
        ax.grid(True, axis="y", alpha=0.3)
    met.set_ylim(0, 105)
    met.set_ylabel("requests meeting the tenant's SLO (%)")
    met.axhline(workload.gate.min_attainment * 100, color="black", linestyle="--", linewidth=1)
    ttft.set_yscale("log")
    ttft.set_ylabel("TTFT p95 of answered requests (s)")
    met.legend(fontsize=8)
    fig.suptitle(f"{workload.name} at {rate:g} req/s: each tenant, per queueing mode")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def prefix_bars(runs: Sequence[StrategyRun], path: Path) -> Path:
    """Per scenario, one bar per strategy: the engines' prefix-cache hit rate, TTFT p95, goodput."""
    plt = _pyplot()
    scenarios = list(dict.fromkeys(r.scenario for r in runs))
    strategies = list(dict.fromkeys(r.strategy for r in runs))
    width = 0.8 / max(1, len(strategies))
    fig, (hits, ttft, good) = plt.subplots(1, 3, figsize=(15, 4.5))
    for j, strategy in enumerate(strategies):
        xs, rows = [], []
        for i, scenario in enumerate(scenarios):
            row = next((r for r in runs if r.scenario == scenario and r.strategy == strategy), None)
            if row is not None:
                xs.append(i + (j - (len(strategies) - 1) / 2) * width)
                rows.append(row)
        hits.bar(
            xs,
            [0.0 if math.isnan(r.hit_rate) else r.hit_rate * 100 for r in rows],
            width=width,
            label=strategy,
        )
        ttft.bar(
            xs, [0.0 if math.isnan(r.ttft_p95) else r.ttft_p95 for r in rows], width=width, label=strategy
        )
        good.bar(xs, [r.goodput for r in rows], width=width, label=strategy)
    for ax in (hits, ttft, good):
        ax.set_xticks(range(len(scenarios)))
        ax.set_xticklabels(scenarios)
        ax.grid(True, axis="y", alpha=0.3)
    hits.set_ylim(0, 100)
    hits.set_ylabel("engines' prefix-cache hit rate (%)")
    ttft.set_yscale("log")
    ttft.set_ylabel("TTFT p95 (s)")
    good.set_ylabel("goodput (requests within SLO / s / engine)")
    hits.legend(fontsize=8)
    fig.suptitle("Placement by strategy: precise (KV events), approximate (rendezvous), least outstanding")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
