"""Driving load through the router: open-loop plans and closed-loop agent sessions."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence

from router.lanelab.client import Result, percentile, slow_stream, stream
from router.lanelab.stack import LAB_KEY
from router.lanelab.workloads import Planned, Session, body
from router.proxy.upstream import UpstreamPool

AUTH = (b"authorization", b"Bearer " + LAB_KEY.encode())
_ids = itertools.count()


def new_id(tag: str) -> str:
    return f"{tag}-{next(_ids)}"


async def run_plan(url: str, plan: Sequence[Planned]) -> list[Result]:
    """Send each planned request at its time (open loop) and wait for every answer."""
    pool = UpstreamPool(url, max_connections=4096, read_timeout=600)
    began = time.monotonic()

    async def one(p: Planned) -> Result:
        await asyncio.sleep(max(0.0, began + p.at - time.monotonic()))
        headers = [AUTH, *p.headers]
        rid = new_id(p.tag)
        if p.slow_bytes_per_s is not None:
            return await slow_stream(url, p.body, headers, p.tag, rid, p.slow_bytes_per_s)
        return await stream(pool, p.body, headers, p.tag, rid)

    try:
        return list(await asyncio.gather(*(one(p) for p in plan)))
    finally:
        await pool.aclose()


async def run_sessions(
    url: str,
    model: str,
    sessions: Sequence[Session],
    *,
    think_s: float,
    max_tokens: int,
    headers: Callable[[Session], list[tuple[bytes, bytes]]] = lambda s: [],
) -> list[Result]:
    """Each session's steps in turn, the next one `think_s` after the previous answer."""
    pool = UpstreamPool(url, max_connections=4096, read_timeout=600)
    began = time.monotonic()
    tools = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]

    async def loop(s: Session) -> list[Result]:
        await asyncio.sleep(max(0.0, began + s.start - time.monotonic()))
        out = []
        for step in range(len(s.steps)):
            payload = body(model, s.messages(step), max_tokens, tools=tools)
            out.append(await stream(pool, payload, [AUTH, *headers(s)], "agent", new_id(s.name)))
            await asyncio.sleep(think_s)
        return out

    try:
        results = await asyncio.gather(*(loop(s) for s in sessions))
    finally:
        await pool.aclose()
    return [r for rs in results for r in rs]


def summary(results: Sequence[Result]) -> dict[str, float]:
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    gaps = [g for r in ok for g in r.gaps]
    e2e = [r.ended - r.started for r in ok if r.ended is not None]
    return {
        "n": float(len(results)),
        "ok": float(len(ok)),
        "ttft_p50": percentile(ttfts, 0.5),
        "ttft_p95": percentile(ttfts, 0.95),
        "itl_p50": percentile(gaps, 0.5),
        "itl_p95": percentile(gaps, 0.95),
        "e2e_p95": percentile(e2e, 0.95),
    }
