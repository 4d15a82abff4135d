"""Per-key limits and affinity keys through a real router."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import orjson

from router.keys.auth import hash_key
from tests.conftest import router_stack
from tests.support.fakebackend import Behaviour
from tests.support.profiles import MODEL, auth, profile

LIMITED = "limited-key-0123456789"


def with_limited_key(**limits: Any) -> Any:
    def shape(urls: list[str]) -> dict[str, Any]:
        data = profile(urls)
        data["keys"].append({"name": "limited", "sha256": hash_key(LIMITED), **limits})
        return data

    return shape


HEADERS = {"authorization": f"Bearer {LIMITED}"}
WHOLE = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}


async def test_requests_per_minute_refuse_with_429_and_forward_nothing() -> None:
    async with router_stack(n_backends=1, shape=with_limited_key(rpm=2)) as stack, stack.client() as client:
        ok = [await client.post("/v1/chat/completions", json=WHOLE, headers=HEADERS) for _ in range(2)]
        refused = await client.post("/v1/chat/completions", json=WHOLE, headers=HEADERS)

        assert [r.status_code for r in ok] == [200, 200]
        assert [r.headers["x-ratelimit-remaining-requests"] for r in ok] == ["1", "0"]
        assert refused.status_code == 429
        assert refused.json()["error"]["type"] == "rate_limit_error"
        assert refused.headers["retry-after"] == "30"
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert stack.forwarded() == 2
        text = stack.state.metrics.exposition().decode()
        assert 'lane_router_rejected_total{reason="rate_limit_requests"} 1.0' in text


async def test_a_tokens_per_minute_refusal_says_when_the_bucket_holds_enough_again() -> None:
    async with (
        router_stack(n_backends=1, shape=with_limited_key(rpm=10, tpm=6000)) as stack,
        stack.client() as client,
    ):
        # The first request keeps its charge (no usage settles it) until the second is refused.
        release = asyncio.Event()
        stack.backends[0].behaviour = Behaviour(tokens=2, hold=release)
        big = {**WHOLE, "max_tokens": 4000}
        first = asyncio.ensure_future(client.post("/v1/chat/completions", json=big, headers=HEADERS))
        await stack.wait_until(lambda: len(stack.backends[0].seen) == 1)
        refused = await client.post("/v1/chat/completions", json=big, headers=HEADERS)
        release.set()
        admitted = await first

    assert admitted.status_code == 200 and refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_tokens"
    estimate = 6000 - int(admitted.headers["x-ratelimit-remaining-tokens"])  # charged from full
    assert estimate > 4000
    # The bucket refills 100 tokens a second; it held `left` and a part of one more when refused.
    left = int(refused.headers["x-ratelimit-remaining-tokens"])
    wait = {math.ceil((estimate - left - 1) / 100), math.ceil((estimate - left) / 100)}
    assert int(refused.headers["retry-after"]) in wait
    for answer in (admitted, refused):
        assert answer.headers["x-ratelimit-limit-tokens"] == "6000"
        assert answer.headers["x-ratelimit-limit-requests"] == "10"
    # Admitted from full buckets: the charge refills at 100 tokens and 1/6 request a second.
    assert admitted.headers["x-ratelimit-remaining-requests"] == "9"
    assert admitted.headers["x-ratelimit-reset-requests"] == "6s"
    assert admitted.headers["x-ratelimit-reset-tokens"] == f"{math.ceil(estimate / 100)}s"
    assert refused.headers["x-ratelimit-reset-tokens"].endswith("s")


async def test_tokens_per_minute_are_corrected_by_the_reported_usage() -> None:
    async with (
        router_stack(n_backends=1, shape=with_limited_key(tpm=6000)) as stack,
        stack.client() as client,
    ):
        stack.backends[0].behaviour = Behaviour(tokens=5)  # usage: total 6, whatever max_tokens says
        big = {**WHOLE, "max_tokens": 500}
        began = time.monotonic()
        first = await client.post("/v1/chat/completions", json=big, headers=HEADERS)
        second = await client.post("/v1/chat/completions", json=big, headers=HEADERS)
        slack = 6000 / 60 * (time.monotonic() - began) + 1

        estimate = 6000 - int(first.headers["x-ratelimit-remaining-tokens"])
        assert first.status_code == second.status_code == 200 and estimate > 500
        # The second sees the first's real usage (6) charged, not its estimate.
        remaining = int(second.headers["x-ratelimit-remaining-tokens"])
        assert abs(remaining - (6000 - 6 - estimate)) <= slack


async def test_usage_of_a_stream_comes_from_its_last_event() -> None:
    tpm = 12_000  # refills 200 tokens/s: the check allows for the time the test takes
    async with router_stack(n_backends=1, shape=with_limited_key(tpm=tpm)) as stack, stack.client() as client:
        stream = {
            **WHOLE,
            "max_tokens": 1000,
            "seed": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        began = time.monotonic()
        first = await client.post("/v1/chat/completions", json=stream, headers=HEADERS)
        second = await client.post("/v1/chat/completions", json=WHOLE, headers=HEADERS)
        slack = tpm / 60 * (time.monotonic() - began) + 1

        usage = orjson.loads(first.text.split("data: ")[-2])["usage"]
        first_estimate = tpm - int(first.headers["x-ratelimit-remaining-tokens"])
        second_estimate = 10 + first_estimate - 1000  # same prompt, max_tokens 10
        assert first_estimate - usage["total_tokens"] > 3 * slack  # the stream stopped early
        remaining = int(second.headers["x-ratelimit-remaining-tokens"])
        assert abs(remaining - (tpm - usage["total_tokens"] - second_estimate)) <= slack


async def test_a_request_refused_by_the_lane_queue_gives_its_quota_back() -> None:
    def shape(urls: list[str]) -> dict[str, Any]:
        data = with_limited_key(rpm=5)(urls)
        data["lanes"]["chat"].update(max_in_flight=1, queue_limit=0)
        return data

    async with router_stack(n_backends=1, shape=shape) as stack, stack.client() as client:
        # The first request holds the lane's one slot until the second was refused, however
        # slowly the machine runs.
        release = asyncio.Event()
        stack.backends[0].behaviour = Behaviour(tokens=2, hold=release)
        held = asyncio.ensure_future(client.post("/v1/chat/completions", json=WHOLE, headers=HEADERS))
        await stack.wait_until(lambda: len(stack.backends[0].seen) == 1)
        refused = await client.post("/v1/chat/completions", json=WHOLE, headers=HEADERS)
        release.set()
        await held
        after = await client.post("/v1/chat/completions", json=WHOLE, headers=HEADERS)

        assert refused.status_code == 503
        assert after.headers["x-ratelimit-remaining-requests"] == "3"  # 5 - held - after


async def test_concurrency_limit() -> None:
    async with router_stack(n_backends=1, shape=with_limited_key(max_concurrency=1)) as stack:
        release = asyncio.Event()
        stack.backends[0].behaviour = Behaviour(tokens=2, hold=release)
        async with stack.client() as client:
            held = asyncio.ensure_future(client.post("/v1/chat/completions", json=WHOLE, headers=HEADERS))
            await stack.wait_until(lambda: len(stack.backends[0].seen) == 1)
            refused = await client.post("/v1/chat/completions", json=WHOLE, headers=HEADERS)
            release.set()
            assert (await held).status_code == 200
            again = await client.post("/v1/chat/completions", json=WHOLE, headers=HEADERS)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_concurrency"
        assert again.status_code == 200


def session_shape(urls: list[str]) -> dict[str, Any]:
    data = profile(urls)
    data["lanes"]["agent"]["balance"] = {
        "strategy": "prefix_affinity",
        "affinity": "session",
        "min_tokens": 64,
    }
    return data


AGENT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "use the tool"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    "max_tokens": 4,
}


async def test_an_agent_session_sticks_to_one_backend_and_sessions_spread() -> None:
    async with router_stack(n_backends=4, shape=session_shape) as stack, stack.client() as client:
        for step in range(3):
            for session in range(12):
                headers = {
                    **auth("user"),
                    "x-session-id": f"s{session}",
                    "x-request-id": f"s{session}-{step}",
                }
                resp = await client.post("/v1/chat/completions", json=AGENT, headers=headers)
                assert resp.status_code == 200
        homes: dict[str, set[int]] = {}
        for i, backend in enumerate(stack.backends):
            for seen in backend.seen:
                homes.setdefault(seen.headers["x-request-id"].split("-")[0], set()).add(i)
        assert len(homes) == 12
        assert all(len(v) == 1 for v in homes.values()), homes
        assert len({next(iter(v)) for v in homes.values()}) >= 3
        text = stack.state.metrics.exposition().decode()
        assert 'lane_router_prefix_affinity_hits_total{pool="interactive"} 36.0' in text


async def test_a_backend_reporting_an_absurd_usage_costs_its_tenant_at_most_a_minute() -> None:
    tpm = 6000
    shape = with_limited_key(tpm=tpm, max_concurrency=1)
    async with router_stack(n_backends=1, shape=shape) as stack, stack.client() as client:
        for total in (b"9" * 400, b"9" * 12):
            stack.backends[0].behaviour = Behaviour(reported_usage=b'{"total_tokens":%s}' % total)
            lied = await client.post("/v1/chat/completions", json=WHOLE, headers=HEADERS)
            assert lied.status_code == 200, lied.text
        stack.backends[0].behaviour = Behaviour()
        # The key's slot came back, and its debt is a minute's tokens at most: within a minute
        # and a bit, its tokens are back above zero.
        again = await client.post("/v1/chat/completions", json=WHOLE, headers=HEADERS)
        assert again.status_code == 429, again.text
        assert again.json()["error"]["code"] == "rate_limit_tokens"
        assert float(again.headers["retry-after"]) <= 2 * 60 + 1
