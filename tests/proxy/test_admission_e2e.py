"""Admission through a real router: prefill limits per backend, lane queues and their deadlines."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.conftest import Stack, router_stack
from tests.support.fakebackend import Behaviour
from tests.support.profiles import MODEL, auth, profile

SHORT = "hello there"
LONG = "lorem ipsum dolor sit amet " * 200  # ≈1350 tokens: long above 1024


def body(text: str, stream: bool = True) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "stream": stream,
        "max_tokens": 4,
    }


def shaped(admission: dict[str, Any] | None = None, **lanes: dict[str, Any]) -> Any:
    def shape(urls: list[str]) -> dict[str, Any]:
        data = profile(urls)
        # Everything stays chat: no long-context threshold, no repeated-prefix detection.
        data["classify"]["long_context_tokens"] = 100_000
        data["classify"]["repeated_prefix"]["seen"] = 1000
        if admission:
            data["pools"]["interactive"]["admission"] = admission
        for cls, extra in lanes.items():
            data["lanes"][cls].update(extra)
        return data

    return shape


async def _post(client: httpx.AsyncClient, text: str, stream: bool = True) -> tuple[httpx.Response, float]:
    resp = await client.post("/v1/chat/completions", json=body(text, stream), headers=auth("user"))
    return resp, time.monotonic()


async def test_a_short_prompt_overtakes_long_prompts_held_by_the_long_prefill_limit() -> None:
    shape = shaped({"max_prefilling": 3, "max_long_prefilling": 1, "long_prompt_tokens": 1024})
    async with router_stack(n_backends=1, shape=shape) as stack:
        backend = stack.backends[0]
        backend.behaviour = Behaviour(tokens=2, ttft_s=0.8)
        async with stack.client() as client:
            longs = [asyncio.ensure_future(_post(client, LONG)) for _ in range(3)]
            await stack.wait_until(lambda: len(backend.seen) == 1)
            short = await _post(client, SHORT)
            results = await asyncio.gather(*longs)

        assert short[0].status_code == 200 and all(r.status_code == 200 for r, _ in results)
        arrivals = [len(s.body) > 1000 for s in backend.seen]
        # One long prefill at a time; the short prompt went in while the first long one prefilled.
        assert arrivals == [True, False, True, True]
        long_starts = [s.started for s in backend.seen if len(s.body) > 1000]
        assert all(b - a >= 0.75 for a, b in itertools.pairwise(long_starts))
        text = stack.state.metrics.exposition().decode()
        assert 'lane_router_queue_time_seconds_count{lane="chat"} 4.0' in text


async def test_the_first_token_releases_the_prefill_slot_not_the_end_of_the_stream() -> None:
    shape = shaped({"max_prefilling": 1})
    async with router_stack(n_backends=1, shape=shape) as stack:
        backend = stack.backends[0]
        backend.behaviour = Behaviour(tokens=20, ttft_s=0.1, itl_s=0.05)  # ≈1.05 s per stream
        async with stack.client() as client:
            started = time.monotonic()
            results = await asyncio.gather(*(_post(client, SHORT) for _ in range(3)))
        assert all(r.status_code == 200 for r, _ in results)
        starts = sorted(s.started - started for s in backend.seen)
        # Each waits for the previous first token (≈0.1 s), not for the previous stream's end.
        assert starts[-1] < 1.2, starts  # after the previous stream's end it would be ≥ 2.1 s


async def test_a_non_streamed_request_holds_its_slot_until_the_response() -> None:
    shape = shaped({"max_prefilling": 1})
    async with router_stack(n_backends=1, shape=shape) as stack:
        backend = stack.backends[0]
        backend.behaviour = Behaviour(tokens=2, ttft_s=0.3)
        async with stack.client() as client:
            await asyncio.gather(*(_post(client, SHORT, stream=False) for _ in range(2)))
        a, b = sorted(s.started for s in backend.seen)
        assert b - a >= 0.25


async def test_with_a_prefill_rate_a_non_streamed_request_releases_after_its_estimate() -> None:
    shape = shaped({"max_prefilling": 1, "prefill_tokens_per_s": 1000})
    async with router_stack(n_backends=1, shape=shape) as stack:
        backend = stack.backends[0]
        backend.behaviour = Behaviour(tokens=2, ttft_s=2.0)
        async with stack.client() as client:
            await asyncio.gather(*(_post(client, SHORT, stream=False) for _ in range(2)))
        a, b = sorted(s.started for s in backend.seen)
        assert b - a < 1.0  # ≈7 tokens / 1000 per s, not the 2 s response


async def test_queue_deadline_answers_503_with_retry_after_and_counts_the_rejection() -> None:
    shape = shaped(chat={"max_in_flight": 1, "queue_timeout_s": 0.2})
    async with router_stack(n_backends=1, shape=shape) as stack:
        # The first request keeps the slot until the second has timed out in the queue.
        release = asyncio.Event()
        stack.backends[0].behaviour = Behaviour(tokens=2, hold=release)
        async with stack.client() as client:
            slow = asyncio.ensure_future(_post(client, SHORT))
            await stack.wait_until(lambda: len(stack.backends[0].seen) == 1)
            refused, _ = await _post(client, SHORT)
            release.set()
            await slow
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "queue_timeout"
        assert int(refused.headers["retry-after"]) >= 1
        assert len(stack.backends[0].seen) == 1
        text = stack.state.metrics.exposition().decode()
        assert 'lane_router_rejected_total{reason="queue_timeout"} 1.0' in text


async def test_a_full_lane_queue_refuses_at_once() -> None:
    shape = shaped(chat={"max_in_flight": 1, "queue_limit": 0})
    async with router_stack(n_backends=1, shape=shape) as stack:
        release = asyncio.Event()
        stack.backends[0].behaviour = Behaviour(tokens=2, hold=release)
        async with stack.client() as client:
            slow = asyncio.ensure_future(_post(client, SHORT))
            await stack.wait_until(lambda: len(stack.backends[0].seen) == 1)
            refused, _ = await _post(client, SHORT)
            # Refused while the slot is still taken, not once it frees.
            still_running = not slow.done()
            release.set()
            await slow
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "queue_full"
        assert still_running


async def test_a_client_leaving_the_queue_frees_its_place() -> None:
    async with router_stack(n_backends=1, shape=shaped(chat={"max_in_flight": 1})) as stack:
        # The first request holds the lane's only slot until the test lets it go, so the second
        # waits in the queue however slowly the machine runs.
        release = asyncio.Event()
        stack.backends[0].behaviour = Behaviour(tokens=2, hold=release)
        runtime = stack.state.runtime
        async with stack.client() as client:
            first = asyncio.ensure_future(_post(client, SHORT))
            await stack.wait_until(lambda: len(stack.backends[0].seen) == 1, timeout=30)
            async with stack.client() as other:
                leaver = asyncio.ensure_future(_post(other, SHORT))
                async with asyncio.timeout(30):
                    while runtime.lanes[next(iter(runtime.lanes))].waiting == 0:
                        await asyncio.sleep(0.01)
                leaver.cancel()
                await asyncio.gather(leaver, return_exceptions=True)
            async with asyncio.timeout(30):
                while any(lane.waiting for lane in runtime.lanes.values()):
                    await asyncio.sleep(0.01)
            release.set()
            await first
        assert len(stack.backends[0].seen) == 1
        assert all(lane.in_flight == 0 for lane in runtime.lanes.values())


async def _until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll a router-side count (no backend event marks it) until it holds."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


async def _refused_by_a_full_queue(stack: Stack, queue_limit: int, behaviour: Behaviour) -> httpx.Response:
    """Measure how fast the chat lane's queue drains (three requests through its one slot, the
    last two completing with requests still waiting), then fill its queue, held, so that one more
    request is refused."""
    lane = stack.state.runtime.lanes["chat"]
    backend = stack.backends[0]
    async with stack.client() as client:
        hold = asyncio.Event()
        backend.behaviour = dataclasses.replace(behaviour, hold=hold)
        measured = [asyncio.ensure_future(_post(client, SHORT)) for _ in range(3)]
        await _until(lambda: lane.waiting == 2)
        hold.set()
        done = await asyncio.gather(*measured)
        assert [r.status_code for r, _ in done] == [200] * 3
        backend.behaviour = dataclasses.replace(behaviour, hold=asyncio.Event())
        queued = [asyncio.ensure_future(_post(client, SHORT)) for _ in range(queue_limit + 1)]
        try:
            await _until(lambda: lane.waiting == queue_limit)
            refused, _ = await _post(client, SHORT)
        finally:
            for request in queued:
                request.cancel()
            await asyncio.gather(*queued, return_exceptions=True)
    return refused


async def test_a_fast_queue_is_told_to_retry_in_a_second() -> None:
    shape = shaped(chat={"max_in_flight": 1, "queue_limit": 2, "queue_timeout_s": 30})
    async with router_stack(n_backends=1, shape=shape) as stack:
        refused = await _refused_by_a_full_queue(stack, 2, Behaviour(tokens=2))
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "queue_full"
    assert refused.headers["retry-after"] == "1"


# Each request holds the lane's only slot for at least half a second: the queue drains two
# requests a second at most, so the 24 ahead take 12 s or more.
SLOW = Behaviour(tokens=2, ttft_s=0.5)


async def test_a_slow_queue_is_told_the_time_its_requests_ahead_take() -> None:
    shape = shaped(chat={"max_in_flight": 1, "queue_limit": 24, "queue_timeout_s": 60})
    async with router_stack(n_backends=1, shape=shape) as stack:
        refused = await _refused_by_a_full_queue(stack, 24, SLOW)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "queue_full"
    assert 12 <= int(refused.headers["retry-after"]) <= 60


async def test_a_queue_is_never_told_to_retry_later_than_its_timeout() -> None:
    shape = shaped(chat={"max_in_flight": 1, "queue_limit": 24, "queue_timeout_s": 8})
    async with router_stack(n_backends=1, shape=shape) as stack:
        refused = await _refused_by_a_full_queue(stack, 24, SLOW)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "8"
