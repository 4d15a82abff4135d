"""Load the real servers feel: a backend at its queue limit.

The `batch` server runs one sequence and admits one request (`max_num_seqs: 1`,
`max_num_queued_reqs: 1`), so one long request sent to it directly fills it and vLLM itself
answers the next one 503. A pool with both servers as backends then shows the router trying the
other backend instead of failing the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from router.lab.realvllm.server import VllmServer
from tests.lab.realvllm.conftest import RealPools
from tests.lab.realvllm.pools import MAX_MODEL_LEN, MODEL_NAME, POOL_KEYS, POOL_VLLM, SHARED_KEY
from tests.lab.realvllm.realrouter import (
    FINISHED,
    REJECTED,
    RealRouter,
    real_router,
    scrape,
    wait_for,
    wait_idle,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]


def long_body(stream: bool = True) -> dict[str, Any]:
    """The longest request the servers' context holds: it keeps the batch server's one sequence."""
    return {"model": MODEL_NAME, "prompt": "Tell me a long story.", "max_tokens": MAX_MODEL_LEN - 64,
            "ignore_eos": True, "stream": stream}  # fmt: skip


@pytest.fixture
async def spill_router(real_pools: RealPools) -> AsyncIterator[RealRouter]:
    """One pool whose backends are both servers, behind the key both accept; every lane uses it
    (a server may belong to one pool only)."""
    data = real_pools.profile()
    data["pools"] = {
        "spill": {
            "backends": [real_pools.interactive.url, real_pools.batch.url],
            "model": MODEL_NAME,
            "upstream_api_key": SHARED_KEY,
            "connect_timeout_s": 10.0,
            "read_timeout_s": 60.0,
            # Two differently tuned servers: the pool declares the narrower one's settings.
            "vllm": dict(POOL_VLLM["batch"]),
        }
    }
    data["lanes"] = {cls: {"pool": "spill", "balance": "round_robin"} for cls in data["lanes"]}
    async with real_router(data) as front:
        await front.settled()
        yield front


@dataclass(frozen=True)
class SpillAttempt:
    """What one try at sending requests past a saturated backend saw."""

    conclusive: bool  # the saturating stream was still open when the router's requests returned
    refused_status: int
    rejected: float  # the full server's own count of requests refused at its queue limit
    retries: float
    upstream_503s: float
    finished_full: float
    finished_spare: float


async def spill_once(full: VllmServer, spare: VllmServer, router: RealRouter) -> SpillAttempt:
    await wait_idle(full)
    await wait_idle(spare)
    # Baselines before the saturating request: a scrape of a streaming vLLM can stall for seconds
    # on this host, so none is taken while the window of saturation is open.
    before_full, before_spare = await scrape(full), await scrape(spare)
    retries = router.metric("lane_router_retries_total", pool="spill")
    upstream_503s = router.metric(
        "lane_router_upstream_errors_total", pool="spill", backend=full.url, reason="upstream_503"
    )
    headers = {"authorization": f"Bearer {POOL_KEYS['batch']}"}
    async with (
        httpx.AsyncClient(timeout=60) as client,
        client.stream("POST", f"{full.url}/v1/completions", json=long_body(), headers=headers) as busy,
    ):
        assert busy.status_code == 200
        events = busy.aiter_lines()
        await anext(events)  # the first token: the request holds the server's only sequence
        reading = asyncio.create_task(drain(events))
        try:
            probe = {**long_body(False), "max_tokens": 4}
            refused = await client.post(f"{full.url}/v1/completions", json=probe, headers=headers)
            # Sent together, so round robin gives one of them to the full server at once and the
            # window they need the saturation to last is one short request, not two in a row.
            api = router.openai()
            replies = await asyncio.gather(
                *(
                    api.chat.completions.create(
                        model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=4
                    )
                    for _ in range(2)
                )
            )
            assert all(reply.choices[0].message.content is not None for reply in replies)
            conclusive = not reading.done()
            await reading
        finally:
            reading.cancel()
    await wait_idle(full)
    after_full = await wait_for(full, lambda s: s.total(FINISHED) > before_full.total(FINISHED))
    after_spare = await wait_for(spare, lambda s: s.total(FINISHED) - before_spare.total(FINISHED) >= 2)
    return SpillAttempt(
        conclusive=conclusive,
        refused_status=refused.status_code,
        rejected=after_full.total(REJECTED, reason="max_num_queued_reqs")
        - before_full.total(REJECTED, reason="max_num_queued_reqs"),
        retries=router.metric("lane_router_retries_total", pool="spill") - retries,
        upstream_503s=router.metric(
            "lane_router_upstream_errors_total", pool="spill", backend=full.url, reason="upstream_503"
        )
        - upstream_503s,
        finished_full=after_full.total(FINISHED) - before_full.total(FINISHED),
        finished_spare=after_spare.total(FINISHED) - before_spare.total(FINISHED),
    )


async def drain(lines: AsyncIterator[str]) -> None:
    async for _ in lines:
        pass


async def test_backend_at_queue_limit_is_retried_on_the_other(
    real_pools: RealPools, spill_router: RealRouter
) -> None:
    full, spare = real_pools.batch, real_pools.interactive
    attempts: list[SpillAttempt] = []
    # The saturating request lasts a few seconds here; a long host stall can outlast it, leaving the
    # server free before the router's requests arrive. Such an attempt proves nothing either
    # way and is repeated.
    while len(attempts) < 5:
        attempts.append(await spill_once(full, spare, spill_router))
        if attempts[-1].conclusive:
            break
    seen = attempts[-1]
    assert seen.conclusive, f"the saturating request ended early in every attempt: {attempts}"
    assert seen.refused_status == 503, "vLLM should refuse past --max-num-queued-reqs"
    # The direct probe was refused once; the router's tries at the full server were the others.
    assert seen.rejected >= 2, f"the router never tried the saturated backend: {seen}"
    assert seen.retries == seen.rejected - 1
    assert seen.upstream_503s == seen.rejected - 1
    assert seen.finished_spare == 2, "both router requests should have been answered by the spare"
    assert seen.finished_full == 1, "only the saturating request should have run on the full server"
