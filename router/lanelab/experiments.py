"""The lane-policy experiments. Each starts fresh simulated engines (H100 Llama-3-8B preset) and a
fresh router process per configuration, sends the same seeded load, and returns table rows."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any

from router.auth import hash_key
from router.config.models import ALL_CLASSES
from router.lanelab import workloads
from router.lanelab.run import AUTH, run_plan, run_sessions, summary
from router.lanelab.stack import LAB_KEY, Sims, prefix_cache, router_process, simulated
from router.lanelab.workloads import Planned
from router.proxy.upstream import UpstreamPool
from router.sim.profile import engine_config
from router.sim.timing import load_preset

PRESET = load_preset("h100-llama3-8b")
MODEL = PRESET.model
Row = dict[str, Any]


def lab_profile(
    urls: list[str], vllm: Mapping[str, Any], lane: Mapping[str, Any], **pool: Any
) -> dict[str, Any]:
    """One pool, every class on it with the same lane policy (so only the policy under test varies)."""
    lanes = {cls.value: {"pool": "p", **lane} for cls in ALL_CLASSES}
    if lane.get("affinity") == "session":
        for cls, cfg in lanes.items():
            if cls != "agent":
                cfg.pop("affinity")
    return {
        "profile": "lanelab",
        "health": {"interval_s": 1.0},
        "scrape": {"interval_s": 0.25, "timeout_s": 1.0},
        "pools": {"p": {"backends": urls, "model": MODEL, "read_timeout_s": 600, "vllm": dict(vllm), **pool}},
        "lanes": lanes,
        "classify": {"long_context_tokens": 100_000, "repeated_prefix": {"min_tokens": 512, "seen": 1000}},
        "keys": [{"name": "lab", "sha256": hash_key(LAB_KEY), "metrics": True}],
    }


@contextlib.asynccontextmanager
async def stack(
    n: int,
    vllm: Mapping[str, Any],
    lane: Mapping[str, Any],
    engine: Mapping[str, Any] | None = None,
    **pool: Any,
) -> AsyncIterator[tuple[Sims, str]]:
    """`n` engines with the pool's `vllm:` settings (plus engine-only `engine` overrides, e.g. a
    smaller KV cache), and the router in front of them."""
    configs = [engine_config(PRESET, dict(vllm), **(engine or {}))] * n
    async with (
        simulated(configs, PRESET.timing, MODEL) as sims,
        router_process(lab_profile(sims.urls, vllm, lane, **pool)) as url,
    ):
        yield sims, url


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
AFFINITY = {"balance": "prefix_affinity", "affinity": "session", "affinity_min_tokens": 512}
BALANCES: list[tuple[str, dict[str, Any], bool]] = [
    ("round_robin", {"balance": "round_robin"}, False),
    ("least_outstanding", {"balance": "least_outstanding"}, False),
    ("prefix_affinity", AFFINITY, False),
]


async def affinity(duration: float = 90.0, rate: float = 10.0, backends: int = 4) -> list[Row]:
    rows = []
    plan = workloads.rag(MODEL, rate, duration)
    sessions = workloads.agent_sessions(24, 8, spread_s=duration / 4)
    for workload in ("rag", "agent"):
        variants = list(BALANCES)
        if workload == "agent":
            variants.append(("prefix_affinity + X-Session-Id", AFFINITY, True))
        for name, lane, session_header in variants:
            async with stack(backends, CACHED_VLLM, lane, SMALL_KV[workload]) as (sims, url):
                before = await prefix_cache(sims.urls)
                if workload == "rag":
                    results = await run_plan(url, plan)
                else:
                    results = await run_sessions(
                        url,
                        MODEL,
                        sessions,
                        think_s=0.5,
                        max_tokens=32,
                        headers=_session_header if session_header else _no_headers,
                    )
                hit = (await prefix_cache(sims.urls)).rate_since(before)
                busy = sum(server.engine.busy_time for server in sims.servers)
            s = summary(results)
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


def _session_header(s: workloads.Session) -> list[tuple[bytes, bytes]]:
    return [(b"x-session-id", s.name.encode())]


def _no_headers(s: workloads.Session) -> list[tuple[bytes, bytes]]:
    return []


# --- partial-prefill admission -------------------------------------------------------------------

FLOOD_VLLM = {
    "max_model_len": 16384,
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 128,
    "long_prefill_token_threshold": 1024,
    "enable_prefix_caching": False,
}


async def admission(duration: float = 40.0, long_rate: float = 3.5, short_rate: float = 4.0) -> list[Row]:
    plan = workloads.long_flood(MODEL, long_rate, short_rate, duration)
    rows = []
    variants: tuple[tuple[str, dict[str, int]], ...] = (
        ("no limit", {}),
        ("max_prefilling 8, max_long_prefilling 1", {"max_prefilling": 8, "max_long_prefilling": 1}),
    )
    for name, limits in variants:
        lane = {"queue_timeout_s": 120, "queue_limit": 100_000}
        async with stack(2, FLOOD_VLLM, lane, admission=limits) as (_, url):
            results = await run_plan(url, plan)
        for tag in ("short", "long"):
            s = summary([r for r in results if r.tag == tag])
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


async def slow_clients(duration: float = 30.0, slow: int = 4, read_bps: float = 8000.0) -> list[Row]:
    chat = workloads.chat(MODEL, 6.0, duration, max_tokens=150)
    long_answers = [
        Planned(1.0 + i, "long-answer", workloads.body(MODEL, [{"role": "user", "content": "Write."}], 1500))
        for i in range(slow)
    ]
    rows = []
    for name, bps in (("read at full speed", None), (f"read at {read_bps / 1000:g} kB/s", read_bps)):
        plan = sorted(
            chat + [Planned(p.at, p.tag, p.body, p.headers, bps) for p in long_answers], key=lambda p: p.at
        )
        async with stack(2, SLOW_VLLM, {}) as (sims, url):
            results = await run_plan(url, plan)
            metrics = await _router_metrics(url)
            finished = {r.request_id: sims.finished(r.request_id) for r in results if r.tag == "long-answer"}
        others = summary([r for r in results if r.tag == "chat"])
        answers = [r for r in results if r.tag == "long-answer"]
        backend_s = [done - r.started for r in answers if (done := finished[r.request_id]) is not None]
        client_s = [r.ended - r.started for r in answers if r.ended is not None]
        complete = sum(
            r.done_marker and r.tokens_reported == 1500 and (r.text_chars == 4 * 1500 or bps is None)
            for r in answers
        )
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


async def _router_metrics(url: str) -> dict[str, float]:
    pool = UpstreamPool(url)
    try:
        resp = await pool.request(b"GET", b"/metrics", [AUTH], b"")
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


async def power_of_two(duration: float = 30.0, external_rate: float = 2.0) -> list[Row]:
    """Another tenant (or router replica) loads backend 0 directly with long prompts; only the
    backends' own /metrics show it. Routed traffic at two rates: light (the router's own
    in-flight counts are mostly zero) and busier."""
    external = [
        Planned(p.at, "external", p.body)
        for p in workloads.long_flood(MODEL, external_rate, 0.0001, duration, long_tokens=5000, seed=9)
    ]
    rows = []
    for rate, max_tokens in ((4.0, 16), (12.0, 64)):
        chat = workloads.chat(MODEL, rate, duration, max_tokens=max_tokens)
        for balance in ("round_robin", "least_outstanding", "power_of_two"):
            async with stack(4, P2C_VLLM, {"balance": balance}) as (sims, url):
                routed, _ = await asyncio.gather(run_plan(url, chat), run_plan(sims.urls[0], external))
                on_loaded = sum(1 for r in routed if sims.servers[0].recorder.finished.get(r.request_id))
            s = summary(routed)
            rows.append(
                {
                    "routed load": f"{rate:g} req/s, {max_tokens} tokens out",
                    "balance": balance,
                    "requests": int(s["n"]),
                    "ok": int(s["ok"]),
                    "sent to the loaded backend": f"{on_loaded / max(1, len(routed)):.0%}",
                    "TTFT p50 ms": _ms(s["ttft_p50"]),
                    "TTFT p95 ms": _ms(s["ttft_p95"]),
                    "e2e p95 ms": _ms(s["e2e_p95"]),
                }
            )
    return rows


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
