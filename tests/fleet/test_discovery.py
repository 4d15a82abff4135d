"""A discovery pool follows its name's answers: new addresses join after a healthy probe,
vanished ones drain, failures keep the last good members and are counted and logged once per
outage, and more addresses than `max_backends` are cut to the lowest ones."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest

from router.config.load import parse_profile
from router.config.models import DiscoveryConfig
from router.fleet.backend import Backend, Health
from router.fleet.discovery import Discovery
from router.fleet.pool import Pool
from router.fleet.resolver import NXDOMAIN, TIMEOUT, ResolveFailed, resolve
from router.observe.metrics import Metrics
from router.state.runtime import Runtime, build_runtime
from tests.support.profiles import profile


class ScriptedDns:
    """Answers from a list the test sets; a `ResolveFailed` in it is raised instead."""

    def __init__(self) -> None:
        self.answer: tuple[str, ...] | ResolveFailed = ()

    async def __call__(self, cfg: DiscoveryConfig) -> tuple[str, ...]:
        if isinstance(self.answer, ResolveFailed):
            raise self.answer
        return self.answer


def by_dns(**discovery: Any) -> Runtime:
    data = profile(["http://127.0.0.1:1"])
    pool = data["pools"]["interactive"]
    del pool["backends"]
    pool["discovery"] = {"dns": "vllm.test", "port": 8000, "interval_s": 1, **discovery}
    return build_runtime(parse_profile(data), Metrics())


class Joined:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, pool: Pool, backends: Sequence[Backend]) -> None:
        self.calls.append([b.name for b in backends])


def origins(backends: Sequence[Backend]) -> list[str]:
    return [b.name for b in backends]


async def test_new_addresses_join_only_after_a_healthy_probe() -> None:
    rt, dns, joined = by_dns(), ScriptedDns(), Joined()
    discovery = Discovery(lambda: rt, rt.metrics, joined, dns)
    pool = rt.pools["interactive"]
    dns.answer = ("10.0.0.2", "10.0.0.1")

    await discovery.refresh(pool)

    assert joined.calls == [["http://10.0.0.1:8000", "http://10.0.0.2:8000"]]
    assert pool.backends == () and [b.index for b in pool.joining] == [0, 1]
    assert pool.routable() == [] and not rt.ready()
    first = pool.joining[0]
    first.health = Health.UP
    rt.fleet.admit(pool, first)
    assert pool.backends == (first,) and rt.ready()
    await discovery.refresh(pool)
    assert joined.calls == [["http://10.0.0.1:8000", "http://10.0.0.2:8000"]]  # nothing new
    await rt.aclose()


async def test_a_vanished_address_drains_and_is_forgotten_once_idle() -> None:
    rt, dns = by_dns(), ScriptedDns()
    discovery = Discovery(lambda: rt, rt.metrics, Joined(), dns)
    pool = rt.pools["interactive"]
    dns.answer = ("10.0.0.1", "10.0.0.2")
    await discovery.refresh(pool)
    for b in pool.joining:
        rt.fleet.admit(pool, b)
    leaving = pool.backends[1]
    leaving.in_flight = 1

    dns.answer = ("10.0.0.1",)
    await discovery.refresh(pool)

    assert origins(pool.backends) == ["http://10.0.0.1:8000"] and pool.draining == (leaving,)
    leaving.in_flight = 0
    rt.enter()
    rt.leave()  # the end of a request sweeps what drained
    assert pool.draining == ()
    await rt.aclose()


async def test_failures_keep_the_last_members_and_an_outage_is_logged_when_it_starts_and_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rt, dns = by_dns(), ScriptedDns()
    discovery = Discovery(lambda: rt, rt.metrics, Joined(), dns)
    pool = rt.pools["interactive"]
    dns.answer = ("10.0.0.1", "10.0.0.2")
    await discovery.refresh(pool)
    caplog.set_level(logging.WARNING, logger="lane_router.discovery")

    for failure in (
        ResolveFailed(TIMEOUT, "slow"),
        ResolveFailed(NXDOMAIN, "gone"),
        ResolveFailed(TIMEOUT, "x"),
    ):
        dns.answer = failure
        await discovery.refresh(pool)

    assert len(pool.members) == 2 and pool.draining == ()
    text = rt.metrics.exposition().decode()
    assert 'lane_router_discovery_errors_total{pool="interactive",reason="timeout"} 2.0' in text
    assert 'lane_router_discovery_errors_total{pool="interactive",reason="nxdomain"} 1.0' in text
    assert [r.getMessage() for r in caplog.records] == [
        "pool interactive: resolving vllm.test failed (timeout: slow); "
        "keeping its 2 backend(s) until it answers"
    ]
    caplog.clear()
    dns.answer = ("10.0.0.1",)
    await discovery.refresh(pool)
    await discovery.refresh(pool)
    assert len(caplog.records) == 1 and "answers again" in caplog.records[0].getMessage()
    assert "3 failed resolution(s), first: timeout" in caplog.records[0].getMessage()
    assert len(pool.members) == 1
    await rt.aclose()


async def test_more_addresses_than_the_cap_use_the_lowest_and_say_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rt, dns = by_dns(max_backends=2), ScriptedDns()
    discovery = Discovery(lambda: rt, rt.metrics, Joined(), dns)
    pool = rt.pools["interactive"]
    caplog.set_level(logging.WARNING, logger="lane_router.discovery")
    dns.answer = ("10.0.0.30", "10.0.0.4", "10.0.0.200")

    await discovery.refresh(pool)
    await discovery.refresh(pool)

    assert origins(pool.members) == ["http://10.0.0.4:8000", "http://10.0.0.30:8000"]
    assert 'lane_router_discovery_truncated{pool="interactive"} 1.0' in rt.metrics.exposition().decode()
    assert [r.getMessage() for r in caplog.records] == [
        "pool interactive: vllm.test has 3 addresses, above discovery.max_backends (2): the lowest 2 are used"
    ]
    dns.answer = ("10.0.0.4",)
    await discovery.refresh(pool)
    assert 'lane_router_discovery_truncated{pool="interactive"} 0.0' in rt.metrics.exposition().decode()
    await rt.aclose()


async def test_the_system_resolver_answers_for_localhost() -> None:
    addresses = await resolve(DiscoveryConfig(dns="localhost", port=8000))

    assert set(addresses) & {"127.0.0.1", "::1"}
