"""`lane-router demo`: simulated engines for the embedded class-aware profile, the router in front,
a short real-time mixed run through it, the per-class table, then everything stops."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from router.lab.bench.generate import generate
from router.lab.bench.outcome import write_jsonl
from router.lab.bench.realtime import RealtimeOptions, run_realtime
from router.lab.bench.report import class_table, routing_table, summarize
from router.lab.bench.routing import pool_model
from router.lab.bench.stack import LocalStack, local_stack
from router.lab.bench.workload import parse_workload

DEMO_PRESET = "h100-llama3-8b"


def _data(name: str) -> tuple[str, Any]:
    resource = resources.files("router.lab") / "data" / name
    return f"router/lab/data/{name}", yaml.safe_load(resource.read_text(encoding="utf-8"))


def key_notice(stack: LocalStack) -> str:
    """How to send requests of one's own while the demo runs, with the key made for this run."""
    return (
        f"key for this run (gone when the demo stops): {stack.key}\n"
        f'  curl -H "Authorization: Bearer {stack.key}" {stack.url}/v1/models'
    )


def run_demo(
    rate: float = 3.0,
    duration: float = 20.0,
    drain: float = 30.0,
    out: Path | None = None,
    progress: bool = True,
) -> int:
    _, profile = _data("demo-profile.yaml")
    source, workload_data = _data("demo-workload.yaml")
    workload = parse_workload(workload_data, source)
    began = time.monotonic()
    print(
        f"starting simulated engines ({DEMO_PRESET}) and the router for profile {profile['profile']!r} …",
        flush=True,
    )
    with local_stack(profile, DEMO_PRESET) as stack:
        pools = ", ".join(f"{name} ×{len(p.backends)}" for name, p in stack.config.pools.items())
        print(f"router at {stack.url} in front of {pools}", flush=True)
        print(key_notice(stack), flush=True)
        trace = generate(workload, model=pool_model(stack.config), rate=rate, duration=duration)
        print(
            f"sending {trace.request_count} requests of six classes at {rate:g} req/s for {duration:g} s …",
            flush=True,
        )
        opts = RealtimeOptions(drain_s=drain, progress=progress, desc="demo")
        outcomes = asyncio.run(run_realtime(trace, stack.endpoint, opts))
    path = out or Path(f"lane-router-demo-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.jsonl")
    with path.open("wb") as f:
        write_jsonl(sorted(outcomes, key=lambda o: o.arrival), f)
    stats = summarize(outcomes, workload, trace.duration)
    print()
    print(class_table(stats))
    print()
    print("Where each class went (lane from the router's debug headers):")
    print(routing_table(stats))
    print(f"\nevery request (TTFT, inter-token gaps, lane, status) → {path}")
    print(f"done in {time.monotonic() - began:.0f} s; engines and router stopped.")
    return 0
