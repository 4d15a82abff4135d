"""`lane-router bench run`: one workload at one offered load, against a live router (real time)
or a profile on the virtual clock; per-class table, JSONL of every request, evidence records."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import orjson

from router.config.load import load_profile
from router.config.models import ProfileConfig
from router.evidence.records import WarmupState
from router.evidence.store import EvidenceStore
from router.lab.bench.generate import Trace, generate
from router.lab.bench.loadclient import Endpoint
from router.lab.bench.outcome import Outcome, write_jsonl
from router.lab.bench.realtime import RealtimeOptions, run_realtime
from router.lab.bench.report import class_table, summarize
from router.lab.bench.workload import WorkloadSpec, load_workload
from router.proxy.upstream import UpstreamPool


@dataclass(frozen=True, slots=True)
class RunArgs:
    workload: Path
    rate: float
    duration: float
    url: str | None = None
    key: str | None = None
    profile: Path | None = None
    virtual: bool = False
    engines: int | None = None
    preset: str = "h100-llama3-8b"
    model: str | None = None
    seed: int | None = None
    out: Path | None = None
    evidence: Path | None = None
    warmup: float = 0.0
    drain: float = 180.0
    progress: bool = True


async def served_model(endpoint: Endpoint) -> str:
    """The first model the endpoint lists on /v1/models."""
    pool = UpstreamPool(endpoint.url, connect_timeout=5.0, read_timeout=10.0)
    headers = [(b"authorization", b"Bearer " + endpoint.key.encode())] if endpoint.key else []
    try:
        resp = await pool.request(b"GET", b"/v1/models", headers, b"")
        body = await resp.read()
    finally:
        await pool.aclose()
    if resp.status != 200:
        raise ValueError(f"{endpoint.url}/v1/models answered {resp.status}: {body[:200]!r}")
    data = orjson.loads(body)["data"]
    if not data:
        raise ValueError(f"{endpoint.url} serves no model")
    return str(data[0]["id"])


def _model(args: RunArgs, cfg: ProfileConfig | None, endpoint: Endpoint | None) -> str:
    if args.model:
        return args.model
    if cfg is not None:
        from router.lab.bench.routing import pool_model

        return pool_model(cfg)
    assert endpoint is not None
    return asyncio.run(served_model(endpoint))


def _measure(
    args: RunArgs, trace: Trace, cfg: ProfileConfig | None, endpoint: Endpoint | None
) -> list[Outcome]:
    if args.virtual:
        from router.lab.bench.virtual import VirtualOptions, run_virtual
        from router.lab.sim.timing import load_preset

        assert cfg is not None
        vopts = VirtualOptions(engines=args.engines, progress=args.progress, desc="virtual")
        return run_virtual(trace, cfg, load_preset(args.preset), vopts).outcomes
    assert endpoint is not None
    if args.warmup > 0:
        warm = generate(
            trace.workload,
            model=trace.model,
            rate=trace.rate,
            duration=args.warmup,
            seed=(args.seed or trace.workload.seed) + 1,
        )
        asyncio.run(
            run_realtime(
                warm, endpoint, RealtimeOptions(progress=args.progress, desc="warmup", drain_s=args.drain)
            )
        )
    opts = RealtimeOptions(progress=args.progress, desc="bench", drain_s=args.drain)
    return asyncio.run(run_realtime(trace, endpoint, opts))


def default_out(workload: WorkloadSpec, rate: float) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return Path(f"bench-{workload.name}-{rate:g}rps-{stamp}.jsonl")


def run(args: RunArgs) -> int:
    workload = load_workload(args.workload)
    cfg = load_profile(args.profile) if args.profile else None
    endpoint = Endpoint(args.url, args.key) if args.url else None
    if args.virtual and cfg is None:
        raise ValueError("--virtual needs --profile")
    if not args.virtual and endpoint is None:
        raise ValueError("give --url (real time) or --virtual with --profile")
    if args.evidence is not None and (cfg is None or args.virtual):
        raise ValueError("--evidence needs --profile and a real-time run (--url)")
    model = _model(args, cfg, endpoint)
    trace = generate(workload, model=model, rate=args.rate, duration=args.duration, seed=args.seed)
    started = datetime.now(UTC)
    outcomes = _measure(args, trace, cfg, endpoint)
    out = args.out or default_out(workload, args.rate)
    with out.open("wb") as f:
        write_jsonl(sorted(outcomes, key=lambda o: o.arrival), f)
    stats = summarize(outcomes, workload, trace.duration)
    print(class_table(stats))
    print(f"\n{len(outcomes)} requests → {out}")
    if args.evidence is not None and cfg is not None:
        _write_evidence(args, cfg, outcomes, trace, started)
    return 0 if stats.passed else 1


def _write_evidence(
    args: RunArgs, cfg: ProfileConfig, outcomes: list[Outcome], trace: Trace, started: datetime
) -> None:
    from router.lab.evidence.measure import lane_records, observed_pools

    assert args.evidence is not None
    params = {"rate": trace.rate, "duration": trace.duration, "seed": args.seed, "model": trace.model}
    workload = args.workload.read_bytes() + orjson.dumps(params, option=orjson.OPT_SORT_KEYS)
    pools = asyncio.run(observed_pools(cfg))
    records = lane_records(
        cfg,
        outcomes,
        pools=pools,
        workload=workload,
        window=trace.duration,
        warmup=WarmupState.DONE if args.warmup > 0 else WarmupState.SKIPPED,
        measured_at=started,
    )
    if not records:
        print(
            "no evidence written: the answers named no lane of this profile "
            "(the router needs debug_headers: true)",
            file=sys.stderr,
        )
        return
    store = EvidenceStore(args.evidence)
    for lane, record in records.items():
        path = store.add(record)
        print(f"evidence for lane {lane}: {path}")
