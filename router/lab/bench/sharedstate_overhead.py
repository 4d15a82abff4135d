"""What shared state costs per request — admission counts and per-key rate limits in Redis — and
how long a slot freed by another router process takes to reach a waiter, side by side in one run.

Cost: four router processes with the same profile in front of one fake backend, differing only
in what they keep and where: nothing shared and no limits (today's single process), the key's
rate limits in memory, `state:` with a key without limits (every request pays the admission
counts: one take script, and its releases sent in the background), and `state:` with the key's
limits in Redis too (plus an acquire and a settle script). The limits are far above the load, so
nothing is refused. Rounds alternate between the routers, so drift of the machine is shared
out; the table gives latency, throughput and each router's own CPU time per request.

Hand-off: a lane with one in-flight slot, a backend that answers in 10 ms, and 8 clients — all
through one router counting in memory, or 4 through each of two routers counting in Redis.
Every request but the first waits for a release; the difference in time per request is what
sharing adds to each hand-off (the release reaching Redis, the news reaching the waiter's
process, its take).

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
from pathlib import Path
from typing import Any

import yaml

from router.keys.auth import new_key
from router.lab.bench.alternating import STARTUP_S, Target, Totals, alternate
from router.lab.bench.overhead import Sample, Scenario, bench_profile, load, pct, wait_up
from router.lab.procs import child_process, free_ports

LIMITS = {"rpm": 10_000_000, "tpm": 1_000_000_000, "max_concurrency": 100_000}
# name → (the key has rate limits, `state:` is configured)
VARIANTS = {
    "local": (False, False),
    "limits in memory": (True, False),
    "counts in Redis": (False, True),
    "counts + limits in Redis": (True, True),
}
SCENARIOS = (
    Scenario(name="non-stream c=1", stream=False, concurrency=1, requests=2000, max_tokens=16),
    Scenario(name="non-stream c=16", stream=False, concurrency=16, requests=4000, max_tokens=16),
)
HANDOFF = Scenario(name="hand-off, 1 slot, 8 clients", stream=True, concurrency=8, requests=400, max_tokens=1)


def profile(
    backend: str, key: str, limited: bool, redis_url: str | None, slots: int | None = None
) -> dict[str, Any]:
    data: dict[str, Any] = bench_profile(backend, key, LIMITS if limited else None)
    data["profile"] = "sharedstate-bench"
    if redis_url is not None:
        data["state"] = {"redis_url": redis_url, "timeout_s": 1.0}
    if slots is not None:
        data["lanes"]["chat"]["max_in_flight"] = slots
    return data


@contextlib.contextmanager
def redis_server(url: str | None, port: int) -> Iterator[str]:
    """`url`, or a redis-server started for the run on `port`."""
    if url is not None:
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found: install Debian's redis-server package or pass --redis-url")
    args = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"]
    with child_process(args):
        yield f"redis://127.0.0.1:{port}/0"


class Routers:
    """Router processes started for the run, each on a profile file of its own and the next of
    `ports` (chosen together with the backends', so no two servers are given one port)."""

    def __init__(self, stack: contextlib.ExitStack, tmp: Path, ports: Iterator[int]) -> None:
        self._stack = stack
        self._tmp = tmp
        self._ports = ports
        self.pids: dict[str, int] = {}
        self.urls: dict[str, str] = {}

    def start(self, name: str, data: dict[str, Any]) -> None:
        path = self._tmp / f"{len(self.pids)}.yaml"
        path.write_text(yaml.safe_dump(data))
        port = next(self._ports)
        argv = [sys.executable, "-m", "router", "serve", "--log-level", "warning", "--config", str(path)]
        self.pids[name] = self._stack.enter_context(child_process([*argv, "--port", str(port)])).pid
        self.urls[name] = f"http://127.0.0.1:{port}"

    def target(self, name: str) -> Target:
        return self.urls[name], self.pids[name]


def run(
    scale: float, rounds: int, redis_url: str | None
) -> tuple[dict[tuple[str, str], Totals], dict[str, Totals]]:
    py = sys.executable
    key = new_key()  # made for this run: nothing published opens these routers
    routers_started = len(VARIANTS) + 3  # and the hand-off's: one local, two sharing redis
    zero, paced, redis_port, *router_ports = free_ports(3 + routers_started)
    backend = [py, "-m", "router.lab.bench.zero_backend", "--port"]
    with (
        redis_server(redis_url, redis_port) as url,
        tempfile.TemporaryDirectory() as tmp,
        contextlib.ExitStack() as stack,
    ):
        stack.enter_context(child_process([*backend, str(zero)]))
        stack.enter_context(child_process([*backend, str(paced), "--ttft-ms", "10"]))
        routers = Routers(stack, Path(tmp), iter(router_ports))
        for variant, (limited, shared) in VARIANTS.items():
            routers.start(variant, profile(_url(zero), key, limited, url if shared else None))
        routers.start("hand-off local", profile(_url(paced), key, False, None, slots=1))
        for side in ("a", "b"):
            routers.start(f"hand-off shared {side}", profile(_url(paced), key, False, url, slots=1))
        return asyncio.run(_measure(key, routers, scale, rounds))


def _url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


async def _measure(
    key: str, routers: Routers, scale: float, rounds: int
) -> tuple[dict[tuple[str, str], Totals], dict[str, Totals]]:
    chosen = {name: routers.target(name) for name in VARIANTS}
    totals = await alternate(SCENARIOS, lambda _: chosen, key, scale, rounds)
    for origin in routers.urls.values():
        await wait_up(origin, b"/ready", STARTUP_S)
    count = max(HANDOFF.concurrency * 4, int(HANDOFF.requests * scale))
    return totals, await _handoffs(key, routers, count, rounds)


async def _handoffs(key: str, routers: Routers, count: int, rounds: int) -> dict[str, Totals]:
    half = Scenario(
        name=HANDOFF.name,
        stream=True,
        concurrency=HANDOFF.concurrency // 2,
        requests=count // 2,
        max_tokens=HANDOFF.max_tokens,
    )
    out = {"local": Totals(), "shared": Totals()}
    for r in range(rounds):
        print(f"  {HANDOFF.name}: round {r + 1}/{rounds} …", file=sys.stderr, flush=True)
        out["local"].add(await load(routers.urls["hand-off local"], HANDOFF, count, key), 0.0)
        a, b = (routers.urls[f"hand-off shared {side}"] for side in "ab")
        both = await asyncio.gather(load(a, half, count // 2, key), load(b, half, count // 2, key))
        latencies = both[0].latencies + both[1].latencies
        errors = both[0].errors + both[1].errors
        out["shared"].add(
            Sample(latencies=latencies, ttfts=[], chunks=0, errors=errors, wall=max(s.wall for s in both)),
            0.0,
        )
    return out


def render(totals: dict[tuple[str, str], Totals], handoffs: dict[str, Totals]) -> str:
    lines = [
        "| scenario | shared state | requests | errors | req/s | p50 ms | p99 ms | router CPU µs/req "
        "| p50 added vs local | p99 added vs local |",
        "|" + "---|" * 10,
    ]
    for sc in SCENARIOS:
        local = totals[(sc.name, "local")].latencies
        for variant in VARIANTS:
            t = totals[(sc.name, variant)]
            added = [f"{(pct(t.latencies, q) - pct(local, q)) * 1e3:+.3f} ms" for q in (0.5, 0.99)]
            lines.append(
                f"| {sc.name} | {variant} | {t.requests} | {t.errors} | {t.requests / t.wall:.0f} "
                f"| {pct(t.latencies, 0.5) * 1e3:.3f} | {pct(t.latencies, 0.99) * 1e3:.3f} "
                f"| {t.cpu_us_per_request():.0f} | {added[0]} | {added[1]} |"
            )
    lines += [
        "",
        "| hand-off (1 slot, 8 clients, 10 ms answers) | requests | errors | ms per request |",
        "|---|---|---|---|",
    ]
    per = {name: t.wall / max(1, t.requests) * 1e3 for name, t in handoffs.items()}
    for name, t in handoffs.items():
        lines.append(f"| {name} | {t.requests} | {t.errors} | {per[name]:.2f} |")
    lines.append(f"| **added per hand-off** | | | {per['shared'] - per['local']:+.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies the requests per scenario")
    parser.add_argument("--rounds", type=int, default=3, help="alternations between the routers")
    parser.add_argument("--redis-url", help="use this Redis instead of starting one")
    args = parser.parse_args(argv)
    totals, handoffs = run(args.scale, max(1, args.rounds), args.redis_url)
    print(render(totals, handoffs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
