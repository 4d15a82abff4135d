"""The router learns each backend's models and LoRA adapters from its /v1/models, every probe
round: an adapter a server starts serving is found, one it stops serving is forgotten; the
adapters the router loads on demand are loaded once per backend however many requests wait."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import pytest

from router.config.drift import drift_of, served_adapters, served_entries
from router.config.load import ConfigError, parse_profile
from router.errors import AdapterLoadFailed
from router.fleet.adapterload import AdapterLoads
from router.fleet.adapters import AdapterNeed, holds
from router.fleet.backend import Backend
from router.observe.metrics import Metrics
from router.state.runtime import build_runtime
from tests.conftest import Stack, router_stack
from tests.support.fakebackend import FakeBackend
from tests.support.profiles import MODEL, UPSTREAM_KEY, profile
from tests.support.servers import server_group


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll a condition the health checker's rounds change (no event to wait on)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def pool_backends(stack: Stack) -> tuple[Backend, ...]:
    return stack.state.runtime.pools["interactive"].backends


def test_v1_models_entries_with_a_parent_are_adapters() -> None:
    listed = {
        "data": [
            {"id": "base", "parent": None},
            {"id": "alias", "parent": None},
            {"id": "sql", "parent": "base", "root": "/srv/lora/sql"},
            {"id": "odd", "parent": "odd"},  # its own parent: a base model's card
            {"id": "bad", "parent": 7},
        ]
    }
    assert served_adapters(served_entries(listed)) == (("sql", "base"),)


async def test_adapters_appear_and_disappear_with_the_probes() -> None:
    async with router_stack() as stack:
        first, second = pool_backends(stack)
        await until(lambda: first.served is not None and second.served is not None)
        assert first.served == frozenset({MODEL}) and first.adapters == ()
        stack.backends[0].adapters["sql"] = "/srv/lora/sql"
        await until(lambda: first.adapters == (("sql", MODEL),))
        assert first.served == frozenset({MODEL, "sql"}) and second.adapters == ()
        fleet = stack.state.runtime.fleet
        assert fleet.learned_adapters == {"sql": MODEL}
        del stack.backends[0].adapters["sql"]
        await until(lambda: first.adapters == ())
        assert fleet.learned_adapters == {} and "sql" not in (first.served or ())


@contextlib.asynccontextmanager
async def one_backend(fake: FakeBackend) -> AsyncIterator[tuple[Backend, AdapterLoads, Metrics]]:
    """A pool of one backend served by `fake` (no probes run), and the fleet's loads."""
    async with server_group() as group:
        origin = (await group.start(fake)).rstrip("/")
        metrics = Metrics()
        runtime = build_runtime(parse_profile(profile([origin])), metrics)
        try:
            (backend,) = runtime.pools["interactive"].backends
            backend.served = frozenset({MODEL})
            yield backend, runtime.fleet.adapter_loads, metrics
        finally:
            await runtime.aclose()


async def test_concurrent_requests_for_an_adapter_share_one_load() -> None:
    fake = FakeBackend()
    fake.lora_load_hold = asyncio.Event()
    async with one_backend(fake) as (backend, loads, metrics):
        need = AdapterNeed("sql", "/srv/lora/sql", lenient=False)
        key = UPSTREAM_KEY.encode()
        waiters = [
            asyncio.ensure_future(loads.ensure(backend, need, key=key, tls=None, timeout=5.0))
            for _ in range(8)
        ]
        await fake.wait_for(lambda: len(fake.lora_loads) == 1)
        # While it loads, the backend counts as the adapter's holder: others wait for it.
        assert holds(backend, need) and loads.running(backend, "sql")
        fake.lora_load_hold.set()
        assert await asyncio.gather(*waiters) == [True] * 8
        assert fake.lora_loads == [{"lora_name": "sql", "lora_path": "/srv/lora/sql"}]
        assert "sql" in (backend.served or ()) and backend.loading == frozenset()
        assert await loads.ensure(backend, need, key=key, tls=None, timeout=5.0) is False
        assert len(fake.lora_loads) == 1
        exposition = metrics.exposition().decode()
    assert 'lane_router_adapter_loads_total{outcome="loaded",pool="interactive"} 1.0' in exposition


async def test_a_failed_load_fails_its_waiters_and_the_next_request_tries_again() -> None:
    fake = FakeBackend()
    fake.lora_load_status = 404
    async with one_backend(fake) as (backend, loads, metrics):
        need = AdapterNeed("sql", "/srv/lora/sql", lenient=False)
        with pytest.raises(AdapterLoadFailed) as failed:
            await loads.ensure(backend, need, key=None, tls=None, timeout=5.0)
        assert failed.value.status == 502 and failed.value.code == "adapter_load_failed"
        assert backend.name not in failed.value.message and "/srv/lora" not in failed.value.message
        assert not holds(backend, need) and backend.loading == frozenset()
        fake.lora_load_status = 200
        assert await loads.ensure(backend, need, key=None, tls=None, timeout=5.0) is True
        assert len(fake.lora_loads) == 2 and holds(backend, need)
        exposition = metrics.exposition().decode()
    assert 'lane_router_adapter_loads_total{outcome="failed",pool="interactive"} 1.0' in exposition


async def test_an_adapter_loaded_since_the_last_probe_counts_as_loaded() -> None:
    fake = FakeBackend()
    fake.adapters["sql"] = "/srv/lora/sql"  # another replica loaded it since the last probe
    async with one_backend(fake) as (backend, loads, _):
        need = AdapterNeed("sql", "/srv/lora/sql", lenient=False)
        assert await loads.ensure(backend, need, key=None, tls=None, timeout=5.0) is True
        assert holds(backend, need) and len(fake.lora_loads) == 1


def test_a_pool_names_adapters_to_load_with_their_path_and_drift_does_not_miss_them() -> None:
    data = profile(["http://127.0.0.1:9100"])
    data["pools"]["interactive"]["adapters"] = ["sql", {"name": "chat-lora", "path": "/srv/lora/chat"}]
    pool = parse_profile(data).pools["interactive"]
    assert pool.models == (MODEL, "sql", "chat-lora")
    listed = {"data": [{"id": MODEL, "max_model_len": 2048}, {"id": "sql", "parent": MODEL}]}
    assert drift_of(pool, None, listed) == ()
    unlisted = {"data": [{"id": MODEL, "max_model_len": 2048}]}
    (missing,) = drift_of(pool, None, unlisted)
    assert missing.field == "adapters" and "['sql'] not served" in missing.live


@pytest.mark.parametrize(
    "entry",
    [{"name": "x"}, {"name": "x", "path": ""}, {"name": "x", "path": "/p", "extra": 1}, {"path": "/p"}],
)
def test_an_adapter_to_load_is_a_name_and_a_path(entry: dict[str, str]) -> None:
    data = profile(["http://127.0.0.1:9100"])
    data["pools"]["interactive"]["adapters"] = [entry]
    with pytest.raises(ConfigError):
        parse_profile(data)


def test_a_profile_does_not_set_adapter_paths_apart_from_the_adapters() -> None:
    data = profile(["http://127.0.0.1:9100"])
    data["pools"]["interactive"]["adapters"] = [{"name": "x", "path": "/p"}]
    data["pools"]["interactive"]["adapter_paths"] = {"y": "/q"}
    with pytest.raises(ConfigError):
        parse_profile(data)
