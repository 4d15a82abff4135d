"""`lane-router bench tenants`: a workload's tenants on one shared lane, first come first served
against fair queueing, on the virtual clock.

Each mode runs the same seeded trace through `run_virtual` with the lanes' admission modelled
(router/lab/bench/lanequeue.py: the router's own `Band`s):

* `fifo` — every tenant's requests under one key: a key's waiters keep their order, so the queue
  is first come, first served (what a lane was before it was fair across keys);
* `fair` — a key per tenant, with its `weight` and `tier`, waiters costing one request each (the
  router's choice);
* `fair-tokens` — the same, each waiter costing its prompt and output tokens.

Per tenant: requests sent, the share that met the tenant's SLO (its own, else its class's), TTFT
p50/p95 of the answered ones, and its throughput: answered requests and their output tokens per
second of the run, from its start to the last answer of any tenant (the lane's own rate is the
sum over tenants).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final

import yaml

from router.config.load import parse_profile, read_yaml
from router.config.models import ProfileConfig
from router.lab.bench.generate import Trace, generate
from router.lab.bench.lanequeue import Cost
from router.lab.bench.outcome import Outcome
from router.lab.bench.report import meets_slo, percentile
from router.lab.bench.virtual import VirtualOptions, run_virtual
from router.lab.bench.workload import WorkloadSpec
from router.lab.sim.timing import Preset

# Mode → (what a waiter costs, whether each tenant is its own key).
MODES: Final[dict[str, tuple[Cost, bool]]] = {
    "fifo": ("requests", False),
    "fair": ("requests", True),
    "fair-tokens": ("tokens", True),
}
PROFILE_DATA: Final = "noisy-tenant-profile.yaml"


@dataclass(frozen=True, slots=True)
class TenantStats:
    tenant: str
    sent: int
    met: int
    answered: int
    ttft_p50: float
    ttft_p95: float
    requests_per_s: float  # answered, per second of the run
    tokens_per_s: float  # output tokens of the answered, per second of the run

    @property
    def attainment(self) -> float:
        return self.met / self.sent if self.sent else math.nan


@dataclass(frozen=True, slots=True)
class ModeRun:
    mode: str
    tenants: tuple[TenantStats, ...]

    def of(self, tenant: str) -> TenantStats:
        return next(t for t in self.tenants if t.tenant == tenant)


def tenant_stats(
    outcomes: Sequence[Outcome], workload: WorkloadSpec, duration: float
) -> tuple[TenantStats, ...]:
    """Each tenant's numbers over `outcomes`, in the workload's tenant order; throughput over
    the span to the last answer (`duration`, the arrivals', if none came later)."""
    by_tenant: dict[str, list[Outcome]] = {t.name: [] for t in workload.tenants}
    for o in outcomes:
        by_tenant.setdefault(o.tenant, []).append(o)
    span = max([duration, *(o.finish for o in outcomes if o.ok and o.finish is not None)])
    out = []
    for name, items in by_tenant.items():
        answered = [o for o in items if o.ok]
        ttfts = [o.ttft for o in answered if o.ttft is not None]
        out.append(
            TenantStats(
                tenant=name,
                sent=len(items),
                met=sum(meets_slo(o, workload.slo_of(o.cls, name)) for o in items),
                answered=len(answered),
                ttft_p50=percentile(ttfts, 50.0),
                ttft_p95=percentile(ttfts, 95.0),
                requests_per_s=len(answered) / span,
                tokens_per_s=sum(o.output_tokens for o in answered) / span,
            )
        )
    return tuple(out)


def run_mode(
    trace: Trace, cfg: ProfileConfig, preset: Preset, mode: str, *, progress: bool = False
) -> ModeRun:
    cost, key_per_tenant = MODES[mode]
    opts = VirtualOptions(progress=progress, desc=mode, queue=cost, key_per_tenant=key_per_tenant)
    run = run_virtual(trace, cfg, preset, opts)
    return ModeRun(mode, tenant_stats(run.outcomes, trace.workload, trace.duration))


def lab_profile_data(path: Path | None = None) -> tuple[Any, str]:
    """The profile mapping at `path`, else the lab's own (router/lab/data/noisy-tenant-profile.yaml),
    and where it came from."""
    if path is not None:
        return read_yaml(path), str(path)
    resource = resources.files("router.lab") / "data" / PROFILE_DATA
    return yaml.safe_load(resource.read_text(encoding="utf-8")), f"router/lab/data/{PROFILE_DATA}"


def load_lab_profile(path: Path | None = None) -> ProfileConfig:
    return parse_profile(*lab_profile_data(path))


def run_tenants(
    workload: WorkloadSpec,
    cfg: ProfileConfig,
    preset: Preset,
    *,
    rate: float,
    duration: float,
    modes: Sequence[str] = ("fifo", "fair"),
    seed: int | None = None,
    progress: bool = False,
) -> list[ModeRun]:
    """The same trace of `workload` under every mode."""
    trace = tenant_trace(workload, cfg, rate=rate, duration=duration, seed=seed)
    return [run_mode(trace, cfg, preset, mode, progress=progress) for mode in modes]


def tenant_trace(
    workload: WorkloadSpec, cfg: ProfileConfig, *, rate: float, duration: float, seed: int | None = None
) -> Trace:
    """The workload's trace, asking for the model of the profile's first pool."""
    if not workload.tenants:
        raise ValueError(f"workload {workload.name!r} names no tenants")
    model = cfg.pools[next(iter(cfg.pools))].model
    return generate(workload, model=model, rate=rate, duration=duration, seed=seed)


def _seconds(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.2f}"


def _slo_text(workload: WorkloadSpec, tenant: str) -> str:
    cls = next(iter(workload.tenant_classes(workload.tenant(tenant))))
    slo = workload.slo_of(cls, tenant)
    parts = [
        f"{label} ≤ {value:g} s"
        for label, value in (("TTFT", slo.ttft_s), ("ITL", slo.itl_s), ("e2e", slo.e2e_s))
        if value is not None
    ]
    return ", ".join(parts)


def table_md(workload: WorkloadSpec, rate: float, runs: Sequence[ModeRun]) -> str:
    """One row per tenant; per mode, SLO attainment, TTFT p50 / p95 and answered throughput."""
    head = ["tenant", "weight", "offered req/s", "SLO"]
    for run in runs:
        head += [
            f"{run.mode}: met SLO",
            f"{run.mode}: TTFT p50 / p95 s",
            f"{run.mode}: answered req/s (tok/s)",
        ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for tenant in workload.tenants:
        row = [
            tenant.name,
            f"{tenant.weight:g}",
            f"{tenant.rate_at(rate):.2f}",
            _slo_text(workload, tenant.name),
        ]
        for run in runs:
            s = run.of(tenant.name)
            row += [
                f"{s.attainment * 100:.0f} % of {s.sent}",
                f"{_seconds(s.ttft_p50)} / {_seconds(s.ttft_p95)}",
                f"{s.requests_per_s:.2f} ({s.tokens_per_s:.0f})",
            ]
        lines.append("| " + " | ".join(row) + " |")
    total = ["the lane", "", f"{sum(t.rate_at(rate) for t in workload.tenants):.2f}", ""]
    for run in runs:
        sent = sum(s.sent for s in run.tenants)
        met = sum(s.met for s in run.tenants)
        requests = sum(s.requests_per_s for s in run.tenants)
        tokens = sum(s.tokens_per_s for s in run.tenants)
        total += [f"{met / sent * 100 if sent else 0:.0f} % of {sent}", "", f"{requests:.2f} ({tokens:.0f})"]
    lines.append("| " + " | ".join(total) + " |")
    return "\n".join(lines) + "\n"


def write_results(
    workload: WorkloadSpec, rate: float, runs: Sequence[ModeRun], out_dir: Path, command: str
) -> list[Path]:
    """`tenants.md` (the command and the table) and `tenants.png` into `out_dir`."""
    from router.lab.bench.plots import tenant_bars

    out_dir.mkdir(parents=True, exist_ok=True)
    table = out_dir / "tenants.md"
    table.write_text(f"```\n{command}\n```\n\n{table_md(workload, rate, runs)}", encoding="utf-8")
    return [table, tenant_bars(workload, rate, runs, out_dir / "tenants.png")]
