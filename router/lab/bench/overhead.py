"""What the router itself costs: the same load against a fake backend directly and through the
router, in one run on loopback, with the router's CPU time per request and per streamed chunk.

Every process is separate (backend, router, load generator), so the router's CPU time is read
from its own /proc entry and nothing else is billed to it."""

from __future__ import annotations

import asyncio
import os
import ssl
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from router.keys.auth import hash_key, new_key
from router.lab.bench.tlscerts import run_certificates
from router.lab.procs import child_process, free_ports
from router.proxy.upstream import UpstreamPool

MODEL = "fake-model"


@dataclass(frozen=True)
class Scenario:
    name: str
    stream: bool
    concurrency: int
    requests: int
    max_tokens: int
    paced: bool = False  # backend with 20 ms TTFT and 5 ms between tokens
    fresh: bool = False  # a new connection per request (with TLS: a handshake each)


SCENARIOS = (
    Scenario(name="non-stream c=1", stream=False, concurrency=1, requests=1500, max_tokens=16),
    Scenario(name="non-stream c=32", stream=False, concurrency=32, requests=4000, max_tokens=16),
    Scenario(name="stream 64 tok c=32", stream=True, concurrency=32, requests=1000, max_tokens=64),
    Scenario(
        name="stream 20ms/5ms c=64", stream=True, concurrency=64, requests=640, max_tokens=64, paced=True
    ),
)
FRESH = (
    Scenario(
        name="non-stream c=1 new conn", stream=False, concurrency=1, requests=1000, max_tokens=16, fresh=True
    ),
)


@dataclass
class Sample:
    latencies: list[float]
    ttfts: list[float]
    chunks: int
    errors: int
    wall: float


@dataclass
class Row:
    scenario: Scenario
    direct: Sample
    routed: Sample
    router_cpu_s: float


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_up(
    origin: str, path: bytes = b"/health", timeout_s: float = 20.0, tls: ssl.SSLContext | None = None
) -> None:
    pool = UpstreamPool(origin, connect_timeout=0.5, ssl_context=tls)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                resp = await pool.request(b"GET", path, [], b"")
                await resp.read()
                await resp.aclose()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{origin} did not come up") from None
                await asyncio.sleep(0.05)
    finally:
        await pool.aclose()


def bench_profile(backend: str, key: str, fields: Mapping[str, object] | None = None) -> dict[str, Any]:
    """One pool of one backend behind every lane, one bench key (`fields` adds to its scopes)."""
    return {
        "profile": "overhead-bench",
        "health": {"interval_s": 60},
        "pools": {
            "p": {
                "backends": [backend],
                "model": MODEL,
                "vllm": {"max_model_len": 4096, "max_num_batched_tokens": 4096},
            }
        },
        "lanes": {
            cls: {"pool": "p"} for cls in ("chat", "rag", "long_context", "agent", "batch", "slow_stream")
        },
        "keys": [{"name": "bench", "sha256": hash_key(key), **(fields or {})}],
    }


async def load(origin: str, sc: Scenario, count: int, key: str, tls: ssl.SSLContext | None = None) -> Sample:
    body = orjson.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Say something."}],
            "max_tokens": sc.max_tokens,
            "stream": sc.stream,
        }
    )
    headers = [(b"authorization", b"Bearer " + key.encode()), (b"content-type", b"application/json")]
    idle = 0 if sc.fresh else sc.concurrency * 2
    pool = UpstreamPool(
        origin, max_connections=sc.concurrency * 2, max_idle=idle, read_timeout=30, ssl_context=tls
    )
    sample = Sample(latencies=[], ttfts=[], chunks=0, errors=0, wall=0.0)
    remaining = count

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            t0 = time.perf_counter()
            first = None
            try:
                resp = await pool.request(b"POST", b"/v1/chat/completions", headers, body)
                try:
                    async for chunk in resp:
                        if first is None:
                            first = time.perf_counter()
                        sample.chunks += chunk.count(b"\n\n") if sc.stream else 1
                finally:
                    await resp.aclose()
                if resp.status != 200:
                    sample.errors += 1
                    continue
            except Exception:
                sample.errors += 1
                continue
            now = time.perf_counter()
            sample.latencies.append(now - t0)
            sample.ttfts.append((first or now) - t0)

    started = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(sc.concurrency)))
    finally:
        sample.wall = time.perf_counter() - started
        await pool.aclose()
    return sample


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _scenario(sc: Scenario, pair: Pair, scale: float, key: str) -> Row:
    backend, router = pair.backend, pair.router
    count = max(sc.concurrency * 4, int(sc.requests * scale))
    warm = max(sc.concurrency, count // 10)
    await load(backend, sc, warm, key)
    direct = await load(backend, sc, count, key)
    await load(router, sc, warm, key, pair.tls)
    cpu0 = cpu_seconds(pair.router_pid)
    routed = await load(router, sc, count, key, pair.tls)
    cpu = cpu_seconds(pair.router_pid) - cpu0
    return Row(sc, direct, routed, cpu)


@dataclass(frozen=True, slots=True)
class Pair:
    """One backend and the router in front of it."""

    backend: str
    router: str
    router_pid: int
    tls: ssl.SSLContext | None = None  # the client's, when the router serves TLS


def run(scale: float = 1.0, scenarios: tuple[Scenario, ...] = SCENARIOS, *, tls: bool = False) -> list[Row]:
    """With `tls` the routers serve TLS (a certificate made for the run) and the load client
    speaks it to them over kept-alive connections; the backends stay plain HTTP."""
    py = sys.executable
    key = new_key()  # made for this run: nothing published opens these routers
    zero_port, paced_port, r_zero, r_paced = free_ports(4)
    with tempfile.TemporaryDirectory() as tmp:
        certs = run_certificates(Path(tmp)) if tls else None
        cfg_zero, cfg_paced = Path(tmp, "zero.yaml"), Path(tmp, "paced.yaml")
        cfg_zero.write_text(yaml.safe_dump(bench_profile(_url(zero_port), key)))
        cfg_paced.write_text(yaml.safe_dump(bench_profile(_url(paced_port), key)))
        backend = [py, "-m", "router.lab.bench.zero_backend"]
        serve = [
            py,
            "-m",
            "router",
            "serve",
            "--log-level",
            "warning",
            *(certs.serve_args() if certs else []),
        ]
        client = certs.client if certs else None
        scheme = "https" if certs else "http"
        with (
            child_process([*backend, "--port", str(zero_port)]),
            child_process([*backend, "--port", str(paced_port), "--ttft-ms", "20", "--itl-ms", "5"]),
            child_process([*serve, "--config", str(cfg_zero), "--port", str(r_zero)]) as router_zero,
            child_process([*serve, "--config", str(cfg_paced), "--port", str(r_paced)]) as router_paced,
        ):
            zero = Pair(_url(zero_port), _url(r_zero, scheme), router_zero.pid, client)
            paced = Pair(_url(paced_port), _url(r_paced, scheme), router_paced.pid, client)
            return asyncio.run(_run_all(scenarios, scale, key, zero, paced))


def _url(port: int, scheme: str = "http") -> str:
    return f"{scheme}://127.0.0.1:{port}"


async def _run_all(
    scenarios: tuple[Scenario, ...], scale: float, key: str, zero: Pair, paced: Pair
) -> list[Row]:
    for origin in (zero.backend, paced.backend):
        await wait_up(origin)
    for pair in (zero, paced):
        await wait_up(pair.router, tls=pair.tls)
    rows = []
    for sc in scenarios:
        pair = paced if sc.paced else zero
        print(f"  running {sc.name} …", file=sys.stderr, flush=True)
        rows.append(await _scenario(sc, pair, scale, key))
    return rows


def render(rows: list[Row]) -> str:
    head = (
        "| scenario | path | req/s | chunks/s | p50 ms | p99 ms | TTFT p50 ms | TTFT p99 ms | errors "
        "| router CPU µs/req | router CPU µs/chunk |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        for label, s in (("direct", r.direct), ("router", r.routed)):
            n = len(s.latencies)
            cpu_req = cpu_chunk = ""
            if label == "router" and n:
                cpu_req = f"{r.router_cpu_s / n * 1e6:.0f}"
                if r.scenario.stream and s.chunks:
                    cpu_chunk = f"{r.router_cpu_s / s.chunks * 1e6:.1f}"
            lines.append(
                f"| {r.scenario.name} | {label} | {n / s.wall:.0f} | {s.chunks / s.wall:.0f} "
                f"| {pct(s.latencies, 0.5) * 1e3:.2f} | {pct(s.latencies, 0.99) * 1e3:.2f} "
                f"| {pct(s.ttfts, 0.5) * 1e3:.2f} | {pct(s.ttfts, 0.99) * 1e3:.2f} | {s.errors} "
                f"| {cpu_req} | {cpu_chunk} |"
            )
        added = [_added(r.routed.latencies, r.direct.latencies, q) for q in (0.5, 0.99)]
        added += [_added(r.routed.ttfts, r.direct.ttfts, q) for q in (0.5, 0.99)]
        lines.append(f"| {r.scenario.name} | **added** | | | " + " | ".join(added) + " | | | |")
    return "\n".join(lines)


def _added(routed: list[float], direct: list[float], q: float) -> str:
    return f"{(pct(routed, q) - pct(direct, q)) * 1e3:+.2f}"
