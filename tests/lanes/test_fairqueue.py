"""The order a band offers room in (router/lanes/fairqueue.py), on its own: two keys that keep
requests waiting on a lane of 2 slots, each request holding its slot for as long as its tokens.
Counted in requests (what the router does) the keys share the requests by weight; counted in
tokens they would share the slots' time by weight. `python -m pytest -s` prints both."""

from __future__ import annotations

import asyncio
import heapq
from collections import Counter

import pytest

from router.keys.tenant import Tenant
from router.lanes.fairqueue import Band, Waiter
from router.lanes.poolgate import Ticket
from tests.lanes.test_poolgate import make_runtime, ticket

SLOTS = 2


def share(
    sizes: dict[str, int], weights: dict[str, float], by_tokens: bool, n: int = 4000
) -> tuple[float, float]:
    """Requests a:b and tokens a:b over `n` completions, every key kept 20 requests deep."""
    loop = asyncio.new_event_loop()
    try:
        t: Ticket = ticket(make_runtime())
        band, keys = Band(), {name: Tenant(name, weights[name]) for name in sizes}
        owner: dict[int, str] = {}

        def enqueue(name: str) -> None:
            waiter = Waiter(t, loop.create_future(), band)
            owner[id(waiter)] = name
            band.add(waiter, keys[name], float(sizes[name]) if by_tokens else 1.0)

        for name in sizes:
            for _ in range(20):
                enqueue(name)
        now, busy, requests, tokens = 0.0, list[tuple[float, int, str]](), Counter[str](), Counter[str]()
        for i in range(n):
            while len(busy) < SLOTS:
                waiter = band.waiters.pop(0)
                band.served(waiter)
                name = owner.pop(id(waiter))
                heapq.heappush(busy, (now + sizes[name], i * SLOTS + len(busy), name))
            now, _, name = heapq.heappop(busy)
            requests[name] += 1
            tokens[name] += sizes[name]
            enqueue(name)
        return requests["a"] / requests["b"], tokens["a"] / tokens["b"]
    finally:
        loop.close()


@pytest.mark.parametrize("weights", [{"a": 1.0, "b": 1.0}, {"a": 3.0, "b": 1.0}])
@pytest.mark.parametrize("sizes", [{"a": 100, "b": 100}, {"a": 1000, "b": 100}])
def test_requests_are_shared_by_weight_and_tokens_would_share_time(
    sizes: dict[str, int], weights: dict[str, float]
) -> None:
    ratio = weights["a"] / weights["b"]
    by_requests, by_tokens = share(sizes, weights, False), share(sizes, weights, True)
    print(f"\n{sizes} weights {weights}: by requests {by_requests}, by tokens {by_tokens}")
    assert by_requests[0] == pytest.approx(ratio, rel=0.01)
    assert by_tokens[1] == pytest.approx(ratio, rel=0.01)


def test_one_keys_waiters_keep_their_order_and_an_emptied_band_starts_afresh() -> None:
    loop = asyncio.new_event_loop()
    try:
        t, band, key = ticket(make_runtime()), Band(), Tenant("k", 2.5)
        waiters = [Waiter(t, loop.create_future(), band) for _ in range(5)]
        for w in waiters:
            band.add(w, key)
        assert band.waiters == waiters
        band.served(waiters[2])
        band.keep([])
        assert band.clock == 0.0 and band.finish_of == {}
    finally:
        loop.close()
