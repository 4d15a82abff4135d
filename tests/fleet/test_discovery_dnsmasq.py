"""Elastic pools against a real dnsmasq: the router's pool follows a name whose hosts file the
test rewrites. Fake backends listen on 127.0.0.2, 127.0.0.3, … (all of 127.0.0.0/8 is loopback
on Linux), each on the same port, so every address is its own backend."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.config.load import parse_profile
from router.fleet.pool import Pool
from router.server import build_state
from router.settings import Settings
from router.state.live import RouterState
from tests.support.dnsmasq import DOMAIN, Dnsmasq, dnsmasq
from tests.support.fakebackend import Behaviour, FakeBackend
from tests.support.profiles import MODEL, auth, profile
from tests.support.servers import ServerGroup, free_port, server_group

NAME = f"vllm.{DOMAIN}"
INTERVAL_S = 0.5
PROBE_TIMEOUT_S = 0.5
STREAM = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
WHOLE = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@dataclass
class Elastic:
    dns: Dnsmasq
    group: ServerGroup
    state: RouterState
    client: httpx.AsyncClient
    port: int
    fakes: dict[str, FakeBackend]

    @property
    def pool(self) -> Pool:
        return self.state.runtime.pools["interactive"]

    def origin(self, address: str) -> str:
        return f"http://{address}:{self.port}"

    async def add_server(self, address: str) -> FakeBackend:
        fake = self.fakes[address] = FakeBackend()
        await self.group.start(fake, self.port, host=address)
        return fake

    def publish(self, *addresses: str) -> None:
        self.dns.set_hosts({NAME: addresses})

    def in_rotation(self) -> list[str]:
        return [b.name for b in self.pool.backends]


def elastic_profile(nameserver: str, port: int) -> dict[str, Any]:
    data = profile(["http://127.0.0.1:1"])
    pool = data["pools"]["interactive"]
    del pool["backends"]
    pool["discovery"] = {"dns": NAME, "port": port, "interval_s": INTERVAL_S, "nameservers": [nameserver]}
    data["health"]["timeout_s"] = PROBE_TIMEOUT_S
    data["lanes"]["chat"]["balance"] = "round_robin"
    return data


@contextlib.asynccontextmanager
async def elastic(tmp_path: Path, *addresses: str) -> AsyncIterator[Elastic]:
    async with dnsmasq(tmp_path) as dns, server_group() as group:
        port = free_port()
        state = build_state(parse_profile(elastic_profile(dns.nameserver, port)), None)
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(timeout=30, limits=limits) as client:
            e = Elastic(dns, group, state, client, port, {})
            for address in addresses:
                await e.add_server(address)
            e.publish(*addresses)
            client.base_url = httpx.URL(await group.serve_router(state, Settings(watch_config=False)))
            await until(lambda: len(e.in_rotation()) == len(addresses))
            yield e


async def until(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    """Wait for router state that no event announces."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


def _ok_stream(resp: httpx.Response) -> bool:
    return resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n")


async def test_a_new_address_takes_requests_after_one_probe_and_a_vanished_one_drains(
    tmp_path: Path,
) -> None:
    async with elastic(tmp_path, "127.0.0.2", "127.0.0.3") as e:
        assert (await e.client.get("/ready")).status_code == 200

        # An added address receives requests within one interval and one probe.
        newcomer = await e.add_server("127.0.0.4")
        e.publish("127.0.0.2", "127.0.0.3", "127.0.0.4")
        published = time.monotonic()
        statuses: list[int] = []
        while not newcomer.seen:
            resp = await e.client.post("/v1/chat/completions", json=WHOLE, headers=auth("user"))
            statuses.append(resp.status_code)
        took = time.monotonic() - published
        print(f"new backend's first request {took:.2f}s after its address was published")
        assert set(statuses) == {200}
        # One interval, one probe, and a second of slack for a busy machine.
        assert took < INTERVAL_S + PROBE_TIMEOUT_S + 1.0

        # An address that vanishes during 50 streams: no new requests, its streams finish.
        for fake in e.fakes.values():
            fake.behaviour = Behaviour(tokens=150, itl_s=0.02)
        leaving = e.fakes["127.0.0.3"]
        before = {a: len(f.seen) for a, f in e.fakes.items()}
        streams = [
            asyncio.ensure_future(e.client.post("/v1/chat/completions", json=STREAM, headers=auth("user")))
            for _ in range(50)
        ]
        await until(lambda: sum(len(f.seen) - before[a] for a, f in e.fakes.items()) == 50)
        on_leaving = leaving.seen[before["127.0.0.3"] :]
        assert on_leaving

        e.publish("127.0.0.2", "127.0.0.4")
        await until(lambda: [b.name for b in e.pool.draining] == [e.origin("127.0.0.3")])
        assert e.pool.draining[0].in_flight > 0, "the streams ended before the address vanished"
        lanes = (await e.client.get("/admin/lanes", headers=auth("ops"))).json()["pools"]["interactive"]
        assert [b["url"] for b in lanes["draining"]] == [e.origin("127.0.0.3")]
        assert {b["url"] for b in lanes["backends"]} == {e.origin("127.0.0.2"), e.origin("127.0.0.4")}
        assert lanes["discovery"]["dns"] == NAME and lanes["discovery"]["addresses"] == 2
        answered = len(leaving.seen)
        for fake in e.fakes.values():
            fake.behaviour = Behaviour()
        for _ in range(6):
            assert (
                await e.client.post("/v1/chat/completions", json=WHOLE, headers=auth("user"))
            ).status_code == 200
        assert len(leaving.seen) == answered  # nothing new went to it

        answers = await asyncio.gather(*streams)
        assert [r.status_code for r in answers if not _ok_stream(r)] == []
        assert all(s.finished is not None and s.disconnected is None for s in on_leaving)
        await until(lambda: e.pool.draining == ())
        metrics = e.state.metrics.exposition().decode()
        assert e.origin("127.0.0.3") not in metrics
        assert e.origin("127.0.0.2") in metrics


def _count(text: str, family: str, **labels: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(family + "{") and all(f'{k}="{v}"' in line for k, v in labels.items())
    )


async def test_when_the_dns_server_stops_the_last_members_keep_serving(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with elastic(tmp_path, "127.0.0.2", "127.0.0.3") as e:
        caplog.set_level(logging.WARNING, logger="lane_router.discovery")
        caplog.clear()
        await e.dns.stop()
        await until(lambda: e.pool.discovery.outage is not None and e.pool.discovery.outage.failures >= 2)

        for _ in range(6):
            assert (
                await e.client.post("/v1/chat/completions", json=WHOLE, headers=auth("user"))
            ).status_code == 200
        assert len(e.in_rotation()) == 2
        metrics = e.state.metrics.exposition().decode()
        assert _count(metrics, "lane_router_discovery_errors_total", pool="interactive") >= 2
        failed = [r.getMessage() for r in caplog.records if "resolving" in r.getMessage()]
        assert len(failed) == 1 and "keeping its 2 backend(s)" in failed[0]

        await e.dns.start()  # the same port
        await until(lambda: e.pool.discovery.outage is None)
        recovered = [r.getMessage() for r in caplog.records if "answers again" in r.getMessage()]
        assert len(recovered) == 1
        assert len([r for r in caplog.records if "resolving" in r.getMessage()]) == 1


def _doc(i: int) -> dict[str, Any]:
    text = f"doc-{i:04d} " + "the same long shared document, read again and again. " * 30
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4}


async def _owners(e: Elastic, docs: int) -> dict[int, str]:
    """Which backend served each document, one request per document."""
    start = {a: len(f.seen) for a, f in e.fakes.items()}
    headers = {**auth("tester"), "x-request-class": "rag"}
    for i in range(docs):
        resp = await e.client.post("/v1/chat/completions", json=_doc(i), headers=headers)
        assert resp.status_code == 200 and resp.headers["x-lane-router-lane"] == "rag"
    owners: dict[int, str] = {}
    for address, fake in e.fakes.items():
        for seen in fake.seen[start[address] :]:
            owners[int(seen.body.split(b"doc-", 1)[1][:4])] = address
    assert len(owners) == docs
    return owners


async def test_prefix_affinity_moves_only_the_documents_of_a_backend_that_left(tmp_path: Path) -> None:
    docs = 240
    four = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
    async with elastic(tmp_path, *four) as e:
        before = await _owners(e, docs)
        e.publish(*four[:3])
        await until(lambda: len(e.in_rotation()) == 3 and e.pool.draining == ())
        after = await _owners(e, docs)

        moved = [i for i in range(docs) if before[i] != after[i]]
        assert all(before[i] == "127.0.0.5" for i in moved)
        assert len(moved) == sum(owner == "127.0.0.5" for owner in before.values())
        removed = len(moved) / docs

        await e.add_server("127.0.0.6")
        e.publish(*four[:3], "127.0.0.6")
        await until(lambda: len(e.in_rotation()) == 4)
        again = await _owners(e, docs)
        added = sum(after[i] != again[i] for i in range(docs)) / docs

    # Adding moves none of them: the balancer remembers where each document went, and every
    # one of those backends is still there (rendezvous alone would move about 1/(N+1)).
    print(f"moved: remove 1 of 4 → {removed:.3f} (1/N = 0.25); add 1 to 3 → {added:.3f}")
    assert abs(removed - 0.25) < 0.12
    assert added <= 0.25 + 0.12
