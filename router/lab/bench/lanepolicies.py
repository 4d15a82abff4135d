"""The lane-policy experiments. Each starts fresh simulated engines (H100 Llama-3-8B preset) in
this process and a fresh router process per configuration (router/lab/bench/stack.py), sends the
same seeded load through the harness's client, and returns table rows (docs/lane-policies.md)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from router.config.models import ALL_CLASSES
from router.lab.bench import laneplans
from router.lab.bench.generate import Item, Request, wire_id
from router.lab.bench.loadclient import Endpoint
from router.lab.bench.outcome import Outcome
from router.lab.bench.realtime import RealtimeOptions, run_items
from router.lab.bench.report import percentile
from router.lab.bench.stack import RouterProcess, routed
from router.lab.sim.profile import engine_config
from router.lab.sim.serve import EngineSpec, SimCluster
from router.lab.sim.server import ServerSettings
from router.lab.sim.timing import load_preset
from router.proxy.upstream import UpstreamPool

PRESET = load_preset("h100-llama3-8b")
MODEL = PRESET.model
Row = dict[str, Any]
# Plans are sent as fast as planned; answers may take minutes under a flood.
OPTIONS = RealtimeOptions(drain_s=600.0, request_timeout_s=600.0, progress=False)


def lab_profile(
    urls: list[str], vllm: Mapping[str, Any], lane: Mapping[str, Any], **pool: Any
) -> dict[str, Any]:
    """One pool, every class on it with the same lane policy (so only the policy under test
    varies); a session affinity applies to the agent lane, the others key on the prefix."""
    lanes = {cls.value: {"pool": "p", **lane} for cls in ALL_CLASSES}
    balance = lane.get("balance")
    if isinstance(balance, Mapping) and balance.get("affinity") == "session":
        for cls, cfg in lanes.items():
            if cls != "agent":
                cfg["balance"] = {**balance, "affinity": "prefix"}
    return {
        "profile": "lanelab",
        "health": {"interval_s": 1.0},
        "scrape": {"interval_s": 0.25, "timeout_s": 1.0},
        "pools": {"p": {"backends": urls, "model": MODEL, "read_timeout_s": 600, "vllm": dict(vllm), **pool}},
        "lanes": lanes,
        "classify": {"long_context_tokens": 100_000, "repeated_prefix": {"min_tokens": 512, "seen": 1000}},
    }


@dataclass(frozen=True, slots=True)
class Lab:
    cluster: SimCluster
    router: RouterProcess


@contextlib.asynccontextmanager
async def stack(
    n: int,
    vllm: Mapping[str, Any],
    lane: Mapping[str, Any],
    engine: Mapping[str, Any] | None = None,
    **pool: Any,
) -> AsyncIterator[Lab]:
    """`n` engines with the pool's `vllm:` settings (plus engine-only `engine` overrides, e.g. a
    smaller KV cache), noting when each answer left them, and the router in front of them."""
    config = engine_config(PRESET, dict(vllm), **(engine or {}))
    settings = ServerSettings(served_model_names=(MODEL,))
    specs = [EngineSpec(0, config, PRESET.timing, settings) for _ in range(n)]
    async with (
        SimCluster(specs, note_deliveries=True) as cluster,
        routed(lab_profile(cluster.urls, vllm, lane, **pool)) as router,
    ):
        yield Lab(cluster, router)


async def run(endpoint: Endpoint, items: Sequence[Item]) -> list[Outcome]:
    return await run_items(items, endpoint, OPTIONS)


def summary(outcomes: Sequence[Outcome]) -> dict[str, float]:
    ok = [o for o in outcomes if o.ok]
    ttfts = [o.ttft for o in ok if o.ttft is not None]
    gaps = [g for o in ok for g in o.gaps]
    e2e = [o.e2e for o in ok if o.e2e is not None]
    return {
        "n": float(len(outcomes)),
        "ok": float(len(ok)),
        "ttft_p50": percentile(ttfts, 50),
        "ttft_p95": percentile(ttfts, 95),
        "itl_p50": percentile(gaps, 50),
        "itl_p95": percentile(gaps, 95),
        "e2e_p95": percentile(e2e, 95),
    }


def _ms(x: float) -> str:
    return f"{x * 1000:.0f}"


# --- prefix affinity ------------------------------------------------------------------------------

CACHED_VLLM = {
    "max_model_len": 16384,
    "max_num_batched_tokens": 4096,
    "max_num_seqs": 64,
    "enable_prefix_caching": True,
}
# Engines with a small KV cache, so that about a quarter of the documents (or agent contexts) fit
# on one: where a request goes decides whether its prefix is cached. RAG: 32 documents of 2000
# tokens (64k) over caches of 2000 blocks (32k tokens); agents: 24 sessions growing to ≈5.5k
# tokens (≈8k blocks) over caches of 3000 blocks.
SMALL_KV = {"rag": {"num_gpu_blocks": 2000}, "agent": {"num_gpu_blocks": 3000}}
AFFINITY = {"balance": {"strategy": "prefix_affinity", "affinity": "session", "min_tokens": 512}}
BALANCES: list[tuple[str, dict[str, Any], bool]] = [
    ("round_robin", {"balance": "round_robin"}, False),
    ("least_outstanding", {"balance": "least_outstanding"}, False),
    ("prefix_affinity", AFFINITY, False),
]


def _workload(name: str, rate: float, duration: float, session_header: bool) -> list[Item]:
    if name == "rag":
        return list(laneplans.rag(MODEL, rate, duration))
    sessions = laneplans.agent_sessions(24, 8, spread_s=duration / 4)
    return [s.plan(MODEL, think_s=0.5, max_tokens=32, session_header=session_header) for s in sessions]


async def affinity(duration: float = 90.0, rate: float = 10.0, backends: int = 4) -> list[Row]:
    rows = []
    for workload in ("rag", "agent"):
        variants = list(BALANCES)
        if workload == "agent":
            variants.append(("prefix_affinity + X-Session-Id", AFFINITY, True))
        for name, lane, session_header in variants:
            items = _workload(workload, rate, duration, session_header)
            async with stack(backends, CACHED_VLLM, lane, SMALL_KV[workload]) as lab:
                before = await prefix_cache(lab.cluster.urls)
                outcomes = await run(lab.router.endpoint, items)
                hit = (await prefix_cache(lab.cluster.urls)).rate_since(before)
                busy = sum(engine.busy_time for engine in lab.cluster.engines)
            s = summary(outcomes)
            rows.append(
                {
                    "workload": workload,
                    "balance": name,
                    "requests": int(s["n"]),
                    "ok": int(s["ok"]),
                    "prefix cache hit rate": f"{hit:.1%}",
                    "engine busy s": f"{busy:.0f}",
                    "TTFT p50 ms": _ms(s["ttft_p50"]),
                    "TTFT p95 ms": _ms(s["ttft_p95"]),
                    "e2e p95 ms": _ms(s["e2e_p95"]),
                }
            )
    return rows


# --- partial-prefill admission -------------------------------------------------------------------

FLOOD_VLLM = {
    "max_model_len": 16384,
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 128,
    "long_prefill_token_threshold": 1024,
    "enable_prefix_caching": False,
}


async def admission(duration: float = 40.0, long_rate: float = 3.5, short_rate: float = 4.0) -> list[Row]:
    plan = laneplans.long_flood(MODEL, long_rate, short_rate, duration)
    rows = []
    variants: tuple[tuple[str, dict[str, int]], ...] = (
        ("no limit", {}),
        ("max_prefilling 8, max_long_prefilling 1", {"max_prefilling": 8, "max_long_prefilling": 1}),
    )
    for name, limits in variants:
        lane = {"queue_timeout_s": 120, "queue_limit": 100_000}
        async with stack(2, FLOOD_VLLM, lane, admission=limits) as lab:
            outcomes = await run(lab.router.endpoint, plan)
        for tag in ("short", "long"):
            s = summary([o for o in outcomes if o.cls == tag])
            rows.append(
                {
                    "router admission": name,
                    "prompts": f"{tag} ({'60' if tag == 'short' else '6000'} tok)",
                    "requests": int(s["n"]),
                    "ok": int(s["ok"]),
                    "TTFT p50 ms": _ms(s["ttft_p50"]),
                    "TTFT p95 ms": _ms(s["ttft_p95"]),
                    "e2e p95 ms": _ms(s["e2e_p95"]),
                }
            )
    return rows


# --- slow clients ---------------------------------------------------------------------------------

SLOW_VLLM = {"max_model_len": 16384, "max_num_batched_tokens": 4096, "max_num_seqs": 128}
LONG_ANSWER_TOKENS = 1500


def _long_answers(count: int, read_bps: float | None) -> list[Request]:
    payload = laneplans.body(MODEL, [{"role": "user", "content": "Write."}], LONG_ANSWER_TOKENS)
    return [
        replace(laneplans.planned("long-answer", i, 1.0 + i, payload, 4), read_bytes_per_s=read_bps)
        for i in range(count)
    ]


def _complete(o: Outcome, slow: bool) -> bool:
    """[DONE] seen, the usage event's token count, and for a slow reader every character of text."""
    chars = not slow or o.output_chars == 4 * LONG_ANSWER_TOKENS
    return o.ok and o.output_tokens == LONG_ANSWER_TOKENS and chars


async def slow_clients(duration: float = 30.0, slow: int = 4, read_bps: float = 8000.0) -> list[Row]:
    chat = laneplans.chat(MODEL, 6.0, duration, max_tokens=150)
    rows = []
    for name, bps in (("read at full speed", None), (f"read at {read_bps / 1000:g} kB/s", read_bps)):
        plan = laneplans.in_time_order(chat + _long_answers(slow, bps))
        async with stack(2, SLOW_VLLM, {}) as lab:
            outcomes = await run(lab.router.endpoint, plan)
            metrics = await _router_metrics(lab.router)
            answers = [o for o in outcomes if o.cls == "long-answer"]
            served = [lab.cluster.delivery(wire_id(o.request_id)) for o in answers]
        others = summary([o for o in outcomes if o.cls == "chat"])
        backend_s = [d.finished - d.started for d in served if d is not None and d.finished is not None]
        client_s = [o.e2e for o in answers if o.e2e is not None]
        complete = sum(_complete(o, bps is not None) for o in answers)
        rows.append(
            {
                "long answers": name,
                "other clients ITL p50 ms": f"{others['itl_p50'] * 1000:.1f}",
                "other clients ITL p95 ms": f"{others['itl_p95'] * 1000:.1f}",
                "other clients TTFT p95 ms": _ms(others["ttft_p95"]),
                "backend done (max s)": f"{max(backend_s, default=float('nan')):.1f}",
                "client done (max s)": f"{max(client_s, default=float('nan')):.1f}",
                "answers complete": f"{complete}/{len(answers)}",
                "slow clients detected": metrics.get('lane_router_slow_clients_total{lane="chat"}', 0.0),
            }
        )
    return rows


async def _router_metrics(router: RouterProcess) -> dict[str, float]:
    pool = UpstreamPool(router.url)
    auth = (b"authorization", b"Bearer " + router.key.encode())
    try:
        resp = await pool.request(b"GET", b"/metrics", [auth], b"")
        text = (await resp.read()).decode()
    finally:
        await pool.aclose()
    out = {}
    for line in text.splitlines():
        if line.startswith("lane_router_"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


# --- load-aware pick ------------------------------------------------------------------------------

P2C_VLLM = {"max_model_len": 16384, "max_num_batched_tokens": 8192, "max_num_seqs": 256}
LOAD_AWARE = ("round_robin", "least_outstanding", "power_of_two", "least_load")


async def power_of_two(duration: float = 30.0, external_rate: float = 2.0) -> list[Row]:
    """Another tenant (or router replica) loads backend 0 directly with long prompts; only the
    backends' own /metrics show it. Routed traffic at two rates: light (the router's own
    in-flight counts are mostly zero) and busier."""
    flood = laneplans.long_flood(MODEL, external_rate, 0.0001, duration, long_tokens=5000, seed=9)
    external = [replace(r, cls="external") for r in flood]
    rows = []
    for rate, max_tokens in ((4.0, 16), (12.0, 64)):
        chat = laneplans.chat(MODEL, rate, duration, max_tokens=max_tokens)
        for balance in LOAD_AWARE:
            async with stack(4, P2C_VLLM, {"balance": balance}) as lab:
                direct = Endpoint(lab.cluster.urls[0], None)
                routed_out, _ = await asyncio.gather(run(lab.router.endpoint, chat), run(direct, external))
                loaded = lab.cluster.deliveries(0)
                on_loaded = sum(1 for o in routed_out if wire_id(o.request_id) in loaded)
            s = summary(routed_out)
            rows.append(
                {
                    "routed load": f"{rate:g} req/s, {max_tokens} tokens out",
                    "balance": balance,
                    "requests": int(s["n"]),
                    "ok": int(s["ok"]),
                    "sent to the loaded backend": f"{on_loaded / max(1, len(routed_out)):.0%}",
                    "TTFT p50 ms": _ms(s["ttft_p50"]),
                    "TTFT p95 ms": _ms(s["ttft_p95"]),
                    "e2e p95 ms": _ms(s["e2e_p95"]),
                }
            )
    return rows


@dataclass(frozen=True, slots=True)
class CacheCounters:
    hits: float
    queries: float

    def rate_since(self, before: CacheCounters) -> float:
        queries = self.queries - before.queries
        return (self.hits - before.hits) / queries if queries else 0.0


async def prefix_cache(urls: list[str]) -> CacheCounters:
    """Σ vllm:prefix_cache_hits / queries over the backends' own /metrics."""
    hits = queries = 0.0
    for url in urls:
        pool = UpstreamPool(url)
        try:
            resp = await pool.request(b"GET", b"/metrics", [], b"")
            text = (await resp.read()).decode()
        finally:
            await pool.aclose()
        for line in text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total"):
                queries += float(line.rsplit(" ", 1)[1])
    return CacheCounters(hits, queries)


EXPERIMENTS: dict[str, Callable[..., Coroutine[Any, Any, list[Row]]]] = {
    "affinity": affinity,
    "admission": admission,
    "slow": slow_clients,
    "p2c": power_of_two,
}


def markdown(rows: list[Row]) -> str:
    if not rows:
        return ""
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r[h]) for h in head) + " |" for r in rows]
    return "\n".join(lines)


def run_experiments(names: Sequence[str], duration: float | None = None) -> int:
    """`lane-router bench lanes NAME…`: each experiment in turn, a markdown table each."""
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        for name in names:
            began = time.monotonic()
            kwargs = {"duration": duration} if duration else {}
            rows = runner.run(EXPERIMENTS[name](**kwargs))
            print(f"## {name}  ({time.monotonic() - began:.0f} s)\n\n{markdown(rows)}\n", flush=True)
    return 0
