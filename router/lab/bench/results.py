"""results.json: a comparison in plain JSON, and back (so reports and plots can be redrawn
without running anything again)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import orjson

from router.lab.bench.compare import CompareSpec, Comparison, Point
from router.lab.bench.report import ClassStats, RunStats, Spread
from router.lab.bench.virtual import PoolUse
from router.lab.bench.workload import parse_workload

FORMAT = 1


def _num(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 6)


def _val(x: float | None) -> float:
    return math.nan if x is None else float(x)


def _spread(values: list[float | None]) -> Spread:
    return Spread(*(_val(v) for v in values))


def comparison_json(c: Comparison) -> dict[str, Any]:
    """Everything measured, in plain JSON types (results.json)."""
    spec = c.spec
    return {
        "format": FORMAT,
        "command": c.command,
        "workload": c.workload.name,
        "workload_file": str(spec.workload_path),
        "workload_spec": c.workload.model_dump(mode="json"),
        "seed": spec.seed if spec.seed is not None else c.workload.seed,
        "mode": spec.mode,
        "preset": spec.preset,
        "engines": spec.engines,
        "settings": [list(o) for o in spec.sets],
        "pool_engines": [list(o) for o in spec.pool_engines],
        "duration_s": spec.duration,
        "requests_per_point": spec.requests,
        "rates": list(spec.rates),
        "profiles": c.profiles,
        "profile_files": [str(p) for p in spec.profile_paths],
        "capacity": {
            name: {"max_passing_rate": rate, "goodput": _num(p.stats.goodput) if p else None}
            for name in c.profiles
            for rate, p in [c.capacity(name)]
        },
        "points": [_point_json(p) for p in c.points],
    }


def _point_json(p: Point) -> dict[str, Any]:
    s = p.stats
    return {
        "profile": p.profile,
        "rate": p.rate,
        "requests": p.requests,
        "window_s": s.window,
        "span_s": s.span,
        "passed": s.passed,
        "failing_classes": s.failing(),
        "goodput": _num(s.goodput),
        "attainment": _num(s.attainment),
        "accepted_share": _num(s.accepted_share),
        "output_tokens_per_s": _num(s.output_tokens_per_s),
        "pools": {
            name: {
                "engines": u.engines,
                "busy": round(u.busy, 4),
                "prefix_hit_rate": round(u.prefix_hit_rate, 4),
                "preemptions": u.preemptions,
            }
            for name, u in p.pools.items()
        },
        "classes": {c.cls: _class_json(c) for c in s.classes.values()},
        "ttft_cdf": {name: [round(v, 6) for v in values] for name, values in p.ttft_quantiles.items()},
    }


def _class_json(c: ClassStats) -> dict[str, Any]:
    return {
        "sent": c.sent,
        "answered": c.answered,
        "met": c.met,
        "attainment": _num(c.attainment),
        "threshold": c.threshold,
        "passed": c.passed,
        "goodput": _num(c.goodput),
        "accepted_rate": _num(c.accepted_rate),
        "accepted_share": _num(c.accepted_share),
        "output_tokens": c.output_tokens,
        "ttft_s": [_num(c.ttft.p50), _num(c.ttft.p95), _num(c.ttft.p99)],
        "itl_s": [_num(c.itl.p50), _num(c.itl.p95), _num(c.itl.p99)],
        "e2e_s": [_num(c.e2e.p50), _num(c.e2e.p95), _num(c.e2e.p99)],
        "lanes": c.lanes,
    }


def _class_from(name: str, d: dict[str, Any]) -> ClassStats:
    return ClassStats(
        cls=name,
        sent=d["sent"],
        answered=d["answered"],
        met=d["met"],
        threshold=d["threshold"],
        ttft=_spread(d["ttft_s"]),
        itl=_spread(d["itl_s"]),
        e2e=_spread(d["e2e_s"]),
        output_tokens=d["output_tokens"],
        goodput=_val(d["goodput"]),
        accepted_rate=_val(d["accepted_rate"]),
        lanes=dict(d["lanes"]),
    )


def _point_from(d: dict[str, Any]) -> Point:
    stats = RunStats(
        window=d["window_s"],
        span=d["span_s"],
        classes={name: _class_from(name, c) for name, c in d["classes"].items()},
    )
    pools = {name: PoolUse(**u) for name, u in d["pools"].items()}
    return Point(
        profile=d["profile"],
        rate=d["rate"],
        stats=stats,
        ttft_quantiles={k: list(v) for k, v in d["ttft_cdf"].items()},
        requests=d["requests"],
        pools=pools,
    )


def comparison_from_json(data: dict[str, Any]) -> Comparison:
    if data.get("format") != FORMAT:
        raise ValueError(f"results format {data.get('format')!r} is not {FORMAT}: run the comparison again")
    workload = parse_workload(data["workload_spec"], "results.json workload_spec")
    spec = CompareSpec(
        workload_path=Path(data["workload_file"]),
        profile_paths=tuple(Path(p) for p in data["profile_files"]),
        rates=tuple(data["rates"]),
        duration=data["duration_s"],
        requests=data["requests_per_point"],
        engines=data["engines"],
        preset=data["preset"],
        mode=data["mode"],
        seed=data["seed"],
        sets=tuple((k, v) for k, v in data["settings"]),
        pool_engines=tuple((k, int(v)) for k, v in data["pool_engines"]),
    )
    points = [_point_from(p) for p in data["points"]]
    return Comparison(
        spec=spec,
        workload=workload,
        profiles=list(data["profiles"]),
        points=points,
        command=str(data.get("command", "")),
    )


def merge(comparisons: list[tuple[str, Comparison]]) -> Comparison:
    """Several comparisons of one workload as one (e.g. a profile and a tuned variant of it). A
    profile name seen before is suffixed with its comparison's label."""
    if not comparisons:
        raise ValueError("nothing to merge")
    first = comparisons[0][1]
    profiles: list[str] = []
    points: list[Point] = []
    for label, c in comparisons:
        if c.workload != first.workload:
            raise ValueError(f"{label}: another workload ({c.workload.name}); only runs of one merge")
        renamed = {name: (f"{name} ({label})" if name in profiles else name) for name in c.profiles}
        profiles += renamed.values()
        points += [dataclasses.replace(p, profile=renamed[p.profile]) for p in c.points]
    rates = tuple(sorted({r for _, c in comparisons for r in c.spec.rates}))
    spec = dataclasses.replace(first.spec, rates=rates)
    command = "\n".join(c.command for _, c in comparisons if c.command)
    points.sort(key=lambda p: (p.rate, profiles.index(p.profile)))
    return Comparison(spec=spec, workload=first.workload, profiles=profiles, points=points, command=command)


def write_results(c: Comparison, path: Path) -> None:
    path.write_bytes(orjson.dumps(comparison_json(c), option=orjson.OPT_INDENT_2) + b"\n")


def read_results(path: Path) -> Comparison:
    return comparison_from_json(orjson.loads(path.read_bytes()))
