"""`lane-router bench overhead --workers N`: the router as one process against `serve --workers N`
(both ways of sharing the port, router/supervisor/workers.py), side by side in one run on loopback.

Routers with the same profile in front of the same fake backends (one answering at once, one
paced at 20 ms to the first token and 5 ms between tokens); the load alternates between them
round by round, so drift of the machine is shared out. Non-streamed scenarios give requests per
second; paced streams with many clients give the stream capacity (chunks relayed per second and
how the token rhythm holds). The CPU column is the router's own time — with workers, the sum of
its processes'."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from router.keys.auth import new_key
from router.lab.bench.alternating import Target, Totals, alternate, tree_cpu_seconds
from router.lab.bench.overhead import Scenario, bench_profile, pct
from router.lab.procs import child_process, free_ports

SCENARIOS = (
    Scenario(name="non-stream c=32", stream=False, concurrency=32, requests=6000, max_tokens=16),
    Scenario(name="non-stream c=128", stream=False, concurrency=128, requests=8000, max_tokens=16),
    Scenario(
        name="stream 20ms/5ms c=64", stream=True, concurrency=64, requests=640, max_tokens=64, paced=True
    ),
    Scenario(
        name="stream 20ms/5ms c=256", stream=True, concurrency=256, requests=1536, max_tokens=64, paced=True
    ),
)


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    workers: int
    sockets: str = "reuseport"


def variants(workers: int) -> tuple[Variant, ...]:
    return (
        Variant("1 process", 1),
        Variant(f"{workers} workers, reuseport", workers, "reuseport"),
        Variant(f"{workers} workers, inherit", workers, "inherit"),
    )


def run(workers: int, scale: float, rounds: int) -> dict[tuple[str, str], Totals]:
    py = sys.executable
    key = new_key()  # made for this run: nothing published opens these routers
    zero_port, paced_port, *ports = free_ports(2 + 2 * len(variants(workers)))
    router_ports = iter(ports)
    backend = [py, "-m", "router.lab.bench.zero_backend"]
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        stack.enter_context(child_process([*backend, "--port", str(zero_port)]))
        stack.enter_context(
            child_process([*backend, "--port", str(paced_port), "--ttft-ms", "20", "--itl-ms", "5"])
        )
        routers: dict[tuple[str, bool], Target] = {}
        for variant in variants(workers):
            for paced, port in ((False, zero_port), (True, paced_port)):
                path = Path(tmp, f"{variant.workers}-{variant.sockets}-{paced}.yaml")
                path.write_text(yaml.safe_dump(bench_profile(f"http://127.0.0.1:{port}", key)))
                routers[(variant.name, paced)] = _start(stack, path, variant, next(router_ports))
        return _measure(workers, key, routers, scale, rounds)


def _start(stack: contextlib.ExitStack, config: Path, variant: Variant, port: int) -> Target:
    argv = [sys.executable, "-m", "router", "serve", "--log-level", "warning", "--config", str(config)]
    argv += ["--port", str(port), "--workers", str(variant.workers)]
    env = {**os.environ, "LANE_ROUTER_WORKER_SOCKETS": variant.sockets}
    proc = stack.enter_context(child_process(argv, env=env))
    return f"http://127.0.0.1:{port}", proc.pid


def _measure(
    workers: int, key: str, routers: dict[tuple[str, bool], Target], scale: float, rounds: int
) -> dict[tuple[str, str], Totals]:
    def targets(sc: Scenario) -> dict[str, Target]:
        return {v.name: routers[(v.name, sc.paced)] for v in variants(workers)}

    return asyncio.run(alternate(SCENARIOS, targets, key, scale, rounds, cpu=tree_cpu_seconds))


def render(workers: int, totals: dict[tuple[str, str], Totals]) -> str:
    lines = [
        "| scenario | router | req/s | chunks/s | p50 ms | p99 ms | TTFT p99 ms | errors "
        "| router CPU µs/req |",
        "|" + "---|" * 9,
    ]
    for sc in SCENARIOS:
        for variant in variants(workers):
            t = totals[(sc.name, variant.name)]
            n = t.requests
            chunks = f"{t.chunks / t.wall:.0f}" if sc.stream else ""
            ttft = f"{pct(t.ttfts, 0.99) * 1e3:.1f}" if sc.stream else ""
            lines.append(
                f"| {sc.name} | {variant.name} | {n / t.wall:.0f} | {chunks} "
                f"| {pct(t.latencies, 0.5) * 1e3:.2f} | {pct(t.latencies, 0.99) * 1e3:.2f} | {ttft} "
                f"| {t.errors} | {t.cpu_us_per_request():.0f} |"
            )
    return "\n".join(lines)
