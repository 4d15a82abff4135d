"""The same seeded workload against several profiles, at one offered load or a sweep of loads.

Every point (profile × rate) regenerates the identical trace from the workload seed, runs it —
on the virtual clock, or in real time against simulated engines and a router on loopback — and
keeps the per-class statistics plus what the plots need. Points are independent, so virtual
runs can go to worker processes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from router.config.models import ProfileConfig
from router.lab.bench.generate import generate
from router.lab.bench.outcome import Outcome
from router.lab.bench.profiles import Override, lab_profile
from router.lab.bench.progress import Bar
from router.lab.bench.report import RunStats, summarize
from router.lab.bench.routing import pool_model
from router.lab.bench.virtual import PoolUse
from router.lab.bench.workload import WorkloadSpec, load_workload

Mode = Literal["virtual", "realtime"]
CDF_POINTS = 120


@dataclass(frozen=True, slots=True)
class CompareSpec:
    workload_path: Path
    profile_paths: tuple[Path, ...]
    rates: tuple[float, ...]
    duration: float | None  # seconds of arrivals per point, or
    requests: int | None  # about this many requests per point (duration = requests / rate)
    engines: int | None
    preset: str
    mode: Mode = "virtual"
    seed: int | None = None
    jobs: int = 1
    sets: tuple[Override, ...] = ()  # set in every pool's vllm: block
    pool_engines: tuple[tuple[str, int], ...] = ()  # fixed engine counts for pools of this name
    progress: bool = True

    def duration_at(self, rate: float) -> float:
        if self.requests is not None:
            return self.requests / rate
        return self.duration if self.duration is not None else 60.0


@dataclass(frozen=True, slots=True)
class Point:
    profile: str
    rate: float
    stats: RunStats
    ttft_quantiles: dict[str, list[float]] = field(default_factory=dict)  # class → sorted sample
    requests: int = 0
    pools: dict[str, PoolUse] = field(default_factory=dict)  # virtual runs: engine use per pool


@dataclass
class Comparison:
    spec: CompareSpec
    workload: WorkloadSpec
    profiles: list[str]
    points: list[Point]
    command: str = ""  # the command line that ran it, for the report

    def point(self, profile: str, rate: float) -> Point | None:
        for p in self.points:
            if p.profile == profile and p.rate == rate:
                return p
        return None

    def capacity(self, profile: str) -> tuple[float | None, Point | None]:
        """The highest swept rate at which `profile` passes the gate, and that point."""
        passing = [p for p in self.points if p.profile == profile and p.stats.passed]
        if not passing:
            return None, None
        best = max(passing, key=lambda p: p.rate)
        return best.rate, best


def profile_name(cfg: ProfileConfig, path: Path) -> str:
    return cfg.profile if cfg.profile != "custom" else path.stem


def thin(values: Sequence[float], points: int = CDF_POINTS) -> list[float]:
    """At most `points` evenly spaced order statistics of `values` (for CDF plots)."""
    ordered = sorted(values)
    if len(ordered) <= points:
        return ordered
    step = (len(ordered) - 1) / (points - 1)
    return [ordered[round(i * step)] for i in range(points)]


def make_point(
    profile: str,
    rate: float,
    outcomes: Sequence[Outcome],
    workload: WorkloadSpec,
    window: float,
    pools: dict[str, PoolUse] | None = None,
) -> Point:
    stats = summarize(outcomes, workload, window)
    ttft: dict[str, list[float]] = {}
    for name in workload.class_names():
        values = [o.ttft for o in outcomes if o.cls == name and o.ok and o.ttft is not None]
        ttft[name] = thin(values)
    return Point(
        profile=profile,
        rate=rate,
        stats=stats,
        ttft_quantiles=ttft,
        requests=len(outcomes),
        pools=pools or {},
    )


def run_point(spec: CompareSpec, profile_path: Path, rate: float, progress: bool = False) -> Point:
    """One profile at one rate; runs in a worker process for virtual comparisons."""
    workload = load_workload(spec.workload_path)
    data, cfg = lab_profile(profile_path, spec.sets)
    name = profile_name(cfg, profile_path)
    trace = generate(
        workload, model=pool_model(cfg), rate=rate, duration=spec.duration_at(rate), seed=spec.seed
    )
    desc = f"{name} @ {rate:g}/s"
    if spec.mode == "virtual":
        from router.lab.bench.virtual import VirtualOptions, run_virtual
        from router.lab.sim.timing import load_preset

        opts = VirtualOptions(
            engines=spec.engines, pool_engines=dict(spec.pool_engines), progress=progress, desc=desc
        )
        run = run_virtual(trace, cfg, load_preset(spec.preset), opts)
        return make_point(name, rate, run.outcomes, workload, trace.duration, run.pools)
    from router.lab.bench.stack import run_on_local_stack

    outcomes = run_on_local_stack(
        trace, data, spec.preset, spec.engines, dict(spec.pool_engines), progress=progress, desc=desc
    )
    return make_point(name, rate, outcomes, workload, trace.duration)


def run_compare(spec: CompareSpec, on_point: Callable[[Point], None] | None = None) -> Comparison:
    workload = load_workload(spec.workload_path)
    names = [profile_name(lab_profile(p, spec.sets)[1], p) for p in spec.profile_paths]
    tasks = [(path, rate) for rate in spec.rates for path in spec.profile_paths]
    points: list[Point] = []
    with Bar(len(tasks), "compare", unit="run", enabled=spec.progress) as bar:
        if spec.jobs > 1 and spec.mode == "virtual":
            with ProcessPoolExecutor(max_workers=spec.jobs) as pool:
                futures = [pool.submit(run_point, spec, path, rate) for path, rate in tasks]
                for future in as_completed(futures):
                    points.append(_done(future.result(), bar, on_point))
        else:
            for path, rate in tasks:
                points.append(_done(run_point(spec, path, rate, spec.progress), bar, on_point))
    order = {n: i for i, n in enumerate(names)}
    points.sort(key=lambda p: (p.rate, order.get(p.profile, math.inf)))
    return Comparison(spec, workload, names, points)


def _done(point: Point, bar: Bar, on_point: Callable[[Point], None] | None) -> Point:
    bar.update()
    bar.note(f"{point.profile} @ {point.rate:g}/s: {'pass' if point.stats.passed else 'fail'}")
    if on_point is not None:
        on_point(point)
    return point
