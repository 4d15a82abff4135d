"""What per-key rate limits cost, with the levels in memory and in Redis, side by side in one run.

Three router processes with the same profile in front of one fake backend, differing only in the
key's limits and where they live: no limits (the rate-limit path is skipped), limits in memory,
limits in Redis (`state.redis_url`). The limits are far above the load, so nothing is refused
and each request pays exactly one acquire and one settle. Rounds alternate between the three, so
drift of the machine is shared out; the table gives latency, throughput and each router's own
CPU time per request, and what Redis adds over memory.

    python -m router.lab.bench.sharedstate_overhead [--scale 1.0] [--rounds 3] [--redis-url URL]

Without `--redis-url` a redis-server (Debian package `redis-server`) is started on a free
loopback port for the run."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from router.auth import new_key
from router.lab.bench.overhead import (
    Sample,
    Scenario,
    bench_profile,
    cpu_seconds,
    free_port,
    load,
    pct,
    wait_up,
)
from router.lab.procs import child_process

LIMITS = {"rpm": 10_000_000, "tpm": 1_000_000_000, "max_concurrency": 100_000}
VARIANTS = ("no limits", "memory", "redis")
SCENARIOS = (Scenario("non-stream c=1", False, 1, 2000, 16), Scenario("non-stream c=16", False, 16, 4000, 16))


@dataclass
class Totals:
    latencies: list[float] = field(default_factory=list)
    requests: int = 0
    errors: int = 0
    wall: float = 0.0
    cpu_s: float = 0.0

    def add(self, sample: Sample, cpu_s: float) -> None:
        self.latencies += sample.latencies
        self.requests += len(sample.latencies)
        self.errors += sample.errors
        self.wall += sample.wall
        self.cpu_s += cpu_s


def profile(backend: str, key: str, limited: bool, redis_url: str | None) -> dict[str, Any]:
    data: dict[str, Any] = bench_profile(backend, key, LIMITS if limited else None)
    data["profile"] = "sharedstate-bench"
    if redis_url is not None:
        data["state"] = {"redis_url": redis_url, "timeout_s": 1.0}
    return data


@contextlib.contextmanager
def redis_server(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found: install Debian's redis-server package or pass --redis-url")
    port = free_port()
    args = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"]
    with child_process(args):
        yield f"redis://127.0.0.1:{port}/0"


def run(requests_scale: float, rounds: int, redis_url: str | None) -> dict[tuple[str, str], Totals]:
    py = sys.executable
    key = new_key()  # made for this run: nothing published opens these routers
    backend_port = free_port()
    ports = {v: free_port() for v in VARIANTS}
    backend = f"http://127.0.0.1:{backend_port}"
    with (
        redis_server(redis_url) as url,
        tempfile.TemporaryDirectory() as tmp,
        contextlib.ExitStack() as stack,
    ):
        stack.enter_context(
            child_process([py, "-m", "router.lab.bench.zero_backend", "--port", str(backend_port)])
        )
        pids = {}
        for variant in VARIANTS:
            path = Path(tmp, f"{variant.replace(' ', '-')}.yaml")
            data = profile(backend, key, variant != "no limits", url if variant == "redis" else None)
            path.write_text(yaml.safe_dump(data))
            serve = [py, "-m", "router", "serve", "--log-level", "warning", "--config", str(path)]
            pids[variant] = stack.enter_context(child_process([*serve, "--port", str(ports[variant])])).pid
        return asyncio.run(_measure(backend, key, ports, pids, requests_scale, rounds))


async def _measure(
    backend: str, key: str, ports: dict[str, int], pids: dict[str, int], scale: float, rounds: int
) -> dict[tuple[str, str], Totals]:
    routers = {v: f"http://127.0.0.1:{p}" for v, p in ports.items()}
    for origin in (backend, *routers.values()):
        await wait_up(origin)
    totals: dict[tuple[str, str], Totals] = {}
    for sc in SCENARIOS:
        count = max(sc.concurrency * 4, int(sc.requests * scale / rounds))
        for origin in routers.values():
            await load(origin, sc, max(sc.concurrency, count // 5), key)  # warm up connections and scripts
        for r in range(rounds):
            print(f"  {sc.name}: round {r + 1}/{rounds} …", file=sys.stderr, flush=True)
            for variant, origin in routers.items():
                cpu0 = cpu_seconds(pids[variant])
                sample = await load(origin, sc, count, key)
                totals.setdefault((sc.name, variant), Totals()).add(sample, cpu_seconds(pids[variant]) - cpu0)
    return totals


def render(totals: dict[tuple[str, str], Totals]) -> str:
    lines = [
        "| scenario | rate limits | requests | errors | req/s | p50 ms | p99 ms | router CPU µs/req "
        "| p50 added vs memory | p99 added vs memory |",
        "|" + "---|" * 10,
    ]
    for sc in SCENARIOS:
        memory = totals[(sc.name, "memory")].latencies
        for variant in VARIANTS:
            t = totals[(sc.name, variant)]
            added = ["", ""]
            if variant != "memory":
                added = [f"{(pct(t.latencies, q) - pct(memory, q)) * 1e3:+.3f} ms" for q in (0.5, 0.99)]
            lines.append(
                f"| {sc.name} | {variant} | {t.requests} | {t.errors} | {t.requests / t.wall:.0f} "
                f"| {pct(t.latencies, 0.5) * 1e3:.3f} | {pct(t.latencies, 0.99) * 1e3:.3f} "
                f"| {t.cpu_s / max(1, t.requests) * 1e6:.0f} | {added[0]} | {added[1]} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies the requests per scenario")
    parser.add_argument("--rounds", type=int, default=3, help="alternations between the three routers")
    parser.add_argument("--redis-url", help="use this Redis instead of starting one")
    args = parser.parse_args(argv)
    print(render(run(args.scale, max(1, args.rounds), args.redis_url)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
