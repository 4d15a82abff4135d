"""Load the real servers feel: a client that walks away mid-stream, and a backend at its queue limit.

The `batch` server runs one sequence and admits one request (`max_num_seqs: 1`,
`max_num_queued_reqs: 1`), so one long request sent to it directly fills it and vLLM itself
answers the next one 503. A pool with both servers as backends then shows the router trying the
other backend instead of failing the request.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from router.lab.realvllm.server import VllmServer
from tests.lab.realvllm.conftest import RealPools
from tests.lab.realvllm.pools import MAX_MODEL_LEN, MODEL_NAME, POOL_KEYS, POOL_VLLM, SHARED_KEY
from tests.lab.realvllm.realrouter import (
    FINISHED,
    GENERATED,
    REJECTED,
    RUNNING,
    RealRouter,
    real_router,
    scrape,
    wait_for,
    wait_idle,
)
from tests.profiles import KEYS

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]

# Far more tokens than the test waits for: a prompt end is the router's doing, not the request's.
LONG = 1500
# Only a bound against a hang: how soon the router notices is its disconnect watch's delay plus
# however long a busy host keeps this process from running.
NOTICE_LIMIT_S = 60.0
# vLLM 0.32 does not always abort a stream whose connection closed (seen here: a request sent
# and left like the others ran to its last token, its server idle and its socket closed), and a
# busy host can keep its API process from the CPU until the whole answer is made. Such an attempt
# says nothing of the router, whose part every attempt checks; it is repeated.
ATTEMPTS = 3


async def running_after(server: VllmServer, since: float, limit: float) -> list[tuple[float, float]]:
    """(seconds after `since` each scrape began, requests running) until none run or `limit`."""
    trace: list[tuple[float, float]] = []
    while True:
        began = time.monotonic() - since
        running = (await scrape(server)).total(RUNNING)
        trace.append((round(began, 3), running))
        if running == 0 or began > limit:
            return trace
        await asyncio.sleep(0.02)


def long_body(stream: bool = True) -> dict[str, Any]:
    """The longest request the servers' context holds: it keeps the batch server's one sequence."""
    return {"model": MODEL_NAME, "prompt": "Tell me a long story.", "max_tokens": MAX_MODEL_LEN - 64,
            "ignore_eos": True, "stream": stream}  # fmt: skip


@dataclass
class Attempt:
    left_first: bool  # the client left before the router had answered the whole response
    ended_after: float  # s from the client leaving to the router ending the request
    received: int  # stream events the client read before it left
    made: float  # tokens the server generated for the request
    trace: list[tuple[float, float]]  # (s after the client left, requests running)


def _ended(router: RealRouter) -> tuple[float, float]:
    """The router's requests ended, in all and as client disconnects mid-stream."""
    return (
        router.metric("lane_router_requests_total"),
        router.metric("lane_router_client_disconnects_total", phase="stream"),
    )


async def _read_then_leave(router: RealRouter, events: int) -> int:
    """Send a long streamed completion to the router, read `events` SSE events, close the socket."""
    body = orjson.dumps(
        {"model": MODEL_NAME, "prompt": "Tell me a long story.", "max_tokens": LONG, "stream": True,
         "ignore_eos": True}
    )  # fmt: skip
    url = urlsplit(router.url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nhost: router\r\nauthorization: Bearer %s\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (KEYS["user"].encode(), len(body), body)
        )
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        received = 0
        while received < events:
            line = await reader.readline()
            assert line, "the stream ended before the client left"
            received += line.startswith(b"data: {")
        return received
    finally:
        writer.close()
        await writer.wait_closed()


async def _leave_early(server: VllmServer, router: RealRouter) -> Attempt:
    """Start a long stream through the router, read a few events, leave. Unless the whole answer
    was already through (a server whose API process was kept from the CPU can deliver it all at
    once), the router must notice and close its upstream connection."""
    await wait_idle(server)
    before = await scrape(server)
    ended, disconnects = _ended(router)
    # A raw socket, closed by this test itself: what the client does when it leaves is exact.
    received = await _read_then_leave(router, events=5)
    closed = time.monotonic()
    # The router runs in this process: this waits on its own state, not the server's.
    while _ended(router)[0] == ended:
        assert time.monotonic() - closed < NOTICE_LIMIT_S, "the router never ended the request"
        await asyncio.sleep(0.01)
    ended_after = round(time.monotonic() - closed, 3)
    left_first = _ended(router)[1] == disconnects + 1
    if left_first:
        [backend] = router.state.runtime.pools["interactive"].backends
        assert backend.upstream.stats().in_use == 0, "the router kept its connection to the server open"
    trace = await running_after(server, closed, limit=120.0)
    print(f"\nrunning requests after the client left (s, n): {trace}", file=sys.stderr)
    assert trace[-1][1] == 0, f"vLLM still runs the request: {trace}"
    made = (await scrape(server)).total(GENERATED) - before.total(GENERATED)
    return Attempt(left_first, ended_after, received, made, trace)


async def test_client_disconnect_aborts_the_request_on_the_server(
    real_pools: RealPools, lane_router: RealRouter
) -> None:
    attempts: list[Attempt] = []
    while len(attempts) < ATTEMPTS:
        attempts.append(await _leave_early(real_pools.interactive, lane_router))
        # Aborted, not finished: with `ignore_eos` the request could only end by making all LONG
        # tokens. (How many fewer depends on the host: a stall of the server's API loop delays
        # it noticing the closed connection while its engine keeps decoding.) Finished-request
        # counters are not compared: another test's short request that vLLM counts a moment
        # late would move them without saying anything about this one.
        if attempts[-1].left_first and attempts[-1].made < LONG:
            break
    last = attempts[-1]
    assert last.left_first, f"the whole answer was through before the client left, every time: {attempts}"
    assert last.received <= last.made < LONG, f"the server never aborted a request: {attempts}"


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
            api = router.openai()
            for _ in range(2):
                reply = await api.chat.completions.create(
                    model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=4
                )
                assert reply.choices[0].message.content is not None
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
    while len(attempts) < 3:
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
