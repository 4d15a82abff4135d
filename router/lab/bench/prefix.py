"""`lane-router bench prefix`: precise, approximate and least-outstanding placement compared on the
virtual clock, with the engines' own prefix-cache counters.

Every run places a seeded trace with the router's own balancers (router/lab/bench/routing.py) over
simulated engines that publish their KV events into the pool's view (router/lab/bench/kvfeed.py),
so a `precise_prefix` lane places on what the engines really hold, a publication delay behind.
Scenarios (the workloads in config/workloads/prefix-*.yaml):

* `rag` — shared instructions, then one of 200 documents of 4k tokens, over 4 engines whose KV
  cache holds about 55 documents each;
* `agent` — many tool-loop sessions whose contexts grow step by step, caches too small for all;
* `churn` — `bare` while the fleet changes: a fifth engine joins, one leaves and comes back
  restarted (its cache empty);
* `fits` — `rag` with caches that hold every document (no pressure, the control);
* `bare` — `rag` without the shared instructions: the prompt starts with its document.

Per strategy: the engines' prefix-cache hit rate (hit tokens over queried tokens, vLLM's
`vllm:prefix_cache_hits` / `vllm:prefix_cache_queries`), TTFT p50 / p95 of the answered requests,
goodput (requests within their class's SLO per second of the run per engine) and how many
backends precise placement judged by approximation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import yaml

from router.config.load import parse_profile
from router.config.models import ProfileConfig
from router.lab.bench.generate import Trace, generate
from router.lab.bench.kvfeed import DEFAULT_DELAY_S
from router.lab.bench.report import meets_slo, percentile
from router.lab.bench.virtual import VirtualOptions, VirtualRun, run_virtual
from router.lab.bench.workload import WorkloadSpec, load_workload
from router.lab.sim.timing import Preset
from router.lab.sim.vclock import Change

STRATEGIES: Final = ("precise_prefix", "prefix_affinity", "least_outstanding")
WORKLOADS: Final = Path("config/workloads")
CLASSES: Final = ("chat", "rag", "long_context", "agent", "batch", "slow_stream")


@dataclass(frozen=True, slots=True)
class Scenario:
    """A workload on a fleet: `engines` backends (`extra` more that join later), each engine's KV
    cache `blocks` blocks, arrivals at `rate` requests/s for `duration` s; `churn`: the fleet
    changes at fixed shares of the duration."""

    name: str
    workload: str  # a file under config/workloads
    rate: float
    duration: float
    blocks: int
    engines: int = 4
    churn: bool = False

    def changes(self, duration: float) -> tuple[Change, ...]:
        """A fifth engine joins at a quarter of the run; the second leaves at half of it and comes
        back, restarted, at three quarters."""
        if not self.churn:
            return ()
        new = self.engines
        return (
            Change(duration * 0.25, new, up=True),
            Change(duration * 0.5, 1, up=False),
            Change(duration * 0.75, 1, up=True),
        )

    @property
    def backends(self) -> int:
        return self.engines + (1 if self.churn else 0)


SCENARIOS: Final = {
    s.name: s
    for s in (
        Scenario("rag", "prefix-rag.yaml", rate=10.0, duration=120.0, blocks=14_000),
        Scenario("agent", "prefix-agent.yaml", rate=12.0, duration=120.0, blocks=6_000),
        Scenario("churn", "prefix-rag-bare.yaml", rate=10.0, duration=120.0, blocks=14_000, churn=True),
        Scenario("fits", "prefix-rag.yaml", rate=10.0, duration=120.0, blocks=60_000),
        Scenario("bare", "prefix-rag-bare.yaml", rate=10.0, duration=120.0, blocks=14_000),
    )
}


@dataclass(frozen=True, slots=True)
class StrategyRun:
    scenario: str
    strategy: str
    sent: int
    answered: int
    met: int
    hit_rate: float  # the engines' own: hit tokens / queried tokens
    ttft_p50: float
    ttft_p95: float
    goodput: float  # requests within SLO per second per engine
    estimated: int
    span: float


def balance_of(spec: str) -> str | dict[str, Any]:
    """A lane's `balance:` from `NAME` or `NAME:KEY=VALUE:…` (a strategy with settings)."""
    name, *settings = spec.split(":")
    if not settings:
        return name
    balance: dict[str, Any] = {"strategy": name}
    for item in settings:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"{spec!r}: a setting is KEY=VALUE, got {item!r}")
        balance[key] = yaml.safe_load(value)
    return balance


def lab_profile(strategy: str, names: Sequence[str], model: str) -> ProfileConfig:
    """One pool of the simulated engines, every class's lane on it, balanced by `strategy`
    (`NAME` or `NAME:KEY=VALUE:…`)."""
    data: dict[str, Any] = {
        "profile": "prefix-lab",
        "tokenizer": "simulator",
        "pools": {
            "fleet": {
                "backends": list(names),
                "model": model,
                "vllm": {
                    "max_model_len": 32768,
                    "max_num_batched_tokens": 8192,
                    "enable_prefix_caching": True,
                },
            }
        },
        "lanes": {cls: {"pool": "fleet", "balance": balance_of(strategy)} for cls in CLASSES},
        "classify": {"long_context_tokens": 32768, "batch_min_output_tokens": 100_000},
    }
    return parse_profile(data, f"<bench prefix: {strategy}>")


def backend_names(n: int) -> list[str]:
    return [f"http://engine-{i}.sim:8000" for i in range(n)]


def scenario_trace(
    scenario: Scenario, workloads: Path, model: str, duration: float, seed: int | None
) -> Trace:
    workload = load_workload(workloads / scenario.workload)
    return generate(workload, model=model, rate=scenario.rate, duration=duration, seed=seed)


def run_strategy(
    scenario: Scenario,
    strategy: str,
    trace: Trace,
    preset: Preset,
    *,
    delay: float = DEFAULT_DELAY_S,
    progress: bool = False,
) -> StrategyRun:
    cfg = lab_profile(strategy, backend_names(scenario.backends), preset.model)
    opts = VirtualOptions(
        progress=progress,
        desc=f"{scenario.name} {strategy}",
        kv_events_delay=delay,
        engine_overrides={"num_gpu_blocks": scenario.blocks},
        changes=scenario.changes(trace.duration),
        absent=tuple(range(scenario.engines, scenario.backends)),
    )
    run = run_virtual(trace, cfg, preset, opts)
    return summarize(scenario, strategy, trace.workload, run, trace.duration)


def summarize(
    scenario: Scenario, strategy: str, workload: WorkloadSpec, run: VirtualRun, duration: float
) -> StrategyRun:
    outcomes = run.outcomes
    answered = [o for o in outcomes if o.ok]
    ttfts = [o.ttft for o in answered if o.ttft is not None]
    met = sum(meets_slo(o, workload.slo_of(o.cls)) for o in outcomes)
    span = max([duration, *(o.finish for o in answered if o.finish is not None)])
    queries = sum(b.prefix_queries for b in run.backends)
    hits = sum(b.prefix_hits for b in run.backends)
    return StrategyRun(
        scenario=scenario.name,
        strategy=strategy,
        sent=len(outcomes),
        answered=len(answered),
        met=met,
        hit_rate=hits / queries if queries else math.nan,
        ttft_p50=percentile(ttfts, 50.0),
        ttft_p95=percentile(ttfts, 95.0),
        goodput=met / span / scenario.engines,
        estimated=run.estimated,
        span=span,
    )


def run_all(
    scenarios: Sequence[Scenario],
    strategies: Sequence[str],
    preset: Preset,
    *,
    workloads: Path = WORKLOADS,
    duration: float | None = None,
    delay: float = DEFAULT_DELAY_S,
    seed: int | None = None,
    progress: bool = False,
) -> list[StrategyRun]:
    """Every strategy on the same trace of every scenario."""
    for strategy in strategies:
        lab_profile(strategy, backend_names(1), preset.model)  # a mistake stops it before any run
    runs: list[StrategyRun] = []
    for scenario in scenarios:
        trace = scenario_trace(scenario, workloads, preset.model, duration or scenario.duration, seed)
        for strategy in strategies:
            runs.append(run_strategy(scenario, strategy, trace, preset, delay=delay, progress=progress))
    return runs


def pick_scenarios(names: str, duration: float | None = None) -> list[Scenario]:
    out = []
    for name in (n.strip() for n in names.split(",") if n.strip()):
        if name not in SCENARIOS:
            raise ValueError(f"unknown scenario {name!r} (known: {', '.join(SCENARIOS)})")
        scenario = SCENARIOS[name]
        out.append(scenario if duration is None else replace(scenario, duration=duration))
    return out


def pick_strategies(names: str) -> list[str]:
    """Comma-separated strategies, each `NAME` or `NAME:KEY=VALUE:…`; the profile checks them."""
    out = [n.strip() for n in names.split(",") if n.strip()]
    if not out:
        raise ValueError("no strategy given")
    return out


def _seconds(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.2f}"


def table_md(runs: Sequence[StrategyRun]) -> str:
    head = [
        "scenario",
        "strategy",
        "cache hit rate",
        "TTFT p50 / p95 s",
        "goodput req/s/engine",
        "met SLO",
        "estimated backends",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        row = [
            r.scenario,
            r.strategy,
            "–" if math.isnan(r.hit_rate) else f"{r.hit_rate * 100:.1f} %",
            f"{_seconds(r.ttft_p50)} / {_seconds(r.ttft_p95)}",
            f"{r.goodput:.2f}",
            f"{r.met / r.sent * 100 if r.sent else 0:.0f} % of {r.sent}",
            str(r.estimated),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def write_results(
    runs: Sequence[StrategyRun], out_dir: Path, command: str, stem: str = "prefix"
) -> list[Path]:
    """`<stem>.md` (the command and the table) and `<stem>.png` into `out_dir`."""
    from router.lab.bench.plots import prefix_bars

    out_dir.mkdir(parents=True, exist_ok=True)
    table = out_dir / f"{stem}.md"
    table.write_text(f"```\n{command}\n```\n\n{table_md(runs)}", encoding="utf-8")
    return [table, prefix_bars(runs, out_dir / f"{stem}.png")]
