"""Router processes that together keep every admission limit: two `lane-router serve` processes,
or one with `--workers 2`, in front of one recording backend (tests/support/scaleout.py) that logs, at
every instant, how many requests await their first byte (and how many of those are long) and
how many it serves. With `state:` on a real redis-server the limits hold for the processes
together; a process killed while it holds slots has them back within the lease; without
`state:` the workers split the limits; Redis stopped mid-run leaves each process its part, and
Redis back brings the shared counts back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from router.config.models import StateConfig
from router.state.slots.store import LEASE_BEATS
from tests.support.redisserver import RedisServer, redis_server
from tests.support.scaleout import (
    RecordingBackend,
    Router,
    burst,
    chat,
    every_worker_ready,
    kill,
    router,
    shaped,
    write_profile,
)
from tests.support.servers import server_group

Backend = tuple[RecordingBackend, str]
LIMITS = {"awaiting": 2, "long": 1, "serving": 3}  # max_prefilling, max_long_prefilling, max_in_flight


@pytest.fixture
async def redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    async with redis_server(tmp_path) as server:
        yield server


@pytest.fixture
async def backend() -> AsyncIterator[Backend]:
    recording = RecordingBackend()
    async with server_group() as group:
        yield recording, await group.serve(recording)


@contextlib.asynccontextmanager
async def topology(kind: str, config: Path) -> AsyncIterator[list[Router]]:
    async with contextlib.AsyncExitStack() as stack:
        if kind == "two processes":
            yield [await stack.enter_async_context(router(config)) for _ in range(2)]
        else:
            r = await stack.enter_async_context(router(config, workers=2))
            await every_worker_ready(r, 2)
            yield [r]


def within(peaks: dict[str, int], limits: dict[str, int]) -> bool:
    return all(peaks[k] <= limits[k] for k in limits)


@pytest.mark.parametrize("kind", ["two processes", "two workers"])
async def test_with_shared_state_the_limits_hold_for_all_router_processes_together(
    kind: str, tmp_path: Path, redis: RedisServer, backend: Backend
) -> None:
    recording, url = backend
    config = write_profile(tmp_path / "p.yaml", shaped(url, state={"redis_url": redis.url, "timeout_s": 2}))
    async with topology(kind, config) as routers:
        statuses = await burst(routers, [chat(long=i % 3 == 0, tokens=6) for i in range(36)])
        served = {
            (labels.get("worker"), r.url): v
            for r in routers
            for labels, v in (await r.metrics())["lane_router_requests_total"]
            if labels["status"] == "200"
        }

    log = recording.recording.log
    assert statuses == [200] * 36
    # Every instant the backend logged stays within the limits, and the limits were reached.
    assert all(a <= 2 and long <= 1 and s <= 3 for a, long, s in log), recording.recording.peaks
    assert recording.recording.peaks == LIMITS
    # Both processes (or both workers) served some; the metrics of either add up to the total.
    assert len(served) == 2 and all(served.values()) and sum(served.values()) == 36


async def test_a_router_process_killed_while_it_holds_slots_has_them_back_within_the_lease(
    tmp_path: Path, redis: RedisServer, backend: Backend
) -> None:
    recording, url = backend
    rec = recording.recording
    data = shaped(url, state={"redis_url": redis.url, "timeout_s": 2})
    data["lanes"]["chat"]["max_in_flight"] = 2
    config = write_profile(tmp_path / "p.yaml", data)
    recording.itl_s = 0.05
    async with router(config) as doomed, router(config) as survivor:
        holding = asyncio.ensure_future(burst([doomed], [chat(tokens=1000), chat(tokens=1000)]))
        await rec.until(lambda: rec.serving == 2)
        kill(doomed.proc.pid)
        killed_at = time.monotonic()
        await rec.until(lambda: rec.serving == 0)  # the backend saw its connections go
        with contextlib.suppress(Exception):
            await holding

        statuses = await burst([survivor], [chat()])
        waited = time.monotonic() - killed_at

    assert statuses == [200]
    # The slots stayed taken until the dead process's lease ran out (its last heartbeat was at
    # most a heartbeat before it died), then the next heartbeat anywhere dropped them.
    beat = StateConfig().heartbeat_s
    lease = LEASE_BEATS * beat
    assert lease - beat - 0.5 <= waited <= lease + 2 * beat + 5


async def test_without_shared_state_workers_split_the_lane_limit(tmp_path: Path, backend: Backend) -> None:
    recording, url = backend
    data = shaped(url)
    data["lanes"]["chat"]["max_in_flight"] = 4
    data["pools"]["interactive"]["admission"] = {}
    config = write_profile(tmp_path / "p.yaml", data)
    async with router(config, workers=2) as r:
        await every_worker_ready(r, 2)
        statuses = await burst([r], [chat(tokens=8) for _ in range(24)])

    assert statuses == [200] * 24
    assert all(s <= 4 for _, _, s in recording.recording.log)
    assert 2 <= recording.recording.peaks["serving"] <= 4


async def test_redis_stopped_mid_run_leaves_each_process_its_part_and_back_shares_again(
    tmp_path: Path, redis: RedisServer, backend: Backend
) -> None:
    recording, url = backend
    rec = recording.recording
    state = {"redis_url": redis.url, "timeout_s": 1, "recheck_s": 0.2}
    data = shaped(url, state=state, replicas=2)  # two replicas: each one's part of 4 is 2
    data["lanes"]["chat"]["max_in_flight"] = 4
    data["pools"]["interactive"]["admission"] = {}
    config = write_profile(tmp_path / "p.yaml", data)
    async with router(config) as a, router(config) as b:
        # Shared: one replica alone may use the whole limit.
        assert await burst([a], [chat(tokens=8) for _ in range(12)]) == [200] * 12
        assert rec.peaks["serving"] == 4
        # B has seen A back within its part: what A held beyond it would count against B's.
        async with asyncio.timeout(30):
            while await b.total("lane_router_shared_slots_excess", lane="chat") != 0:
                await asyncio.sleep(0.05)

        await redis.stop()
        rec.reset_peaks()
        statuses = await burst([a, b], [chat(tokens=8) for _ in range(24)])
        assert statuses == [200] * 24  # requests go on
        assert rec.peaks["serving"] <= 4
        rec.reset_peaks()
        assert await burst([a], [chat(tokens=8) for _ in range(8)]) == [200] * 8
        assert rec.peaks["serving"] == 2  # a alone keeps to its part
        errors = await a.total("lane_router_shared_state_errors_total", op="slot_take")
        assert errors >= 8  # the failure, then every admission counted locally

        await redis.start()
        async with asyncio.timeout(30):
            while True:  # until a burst through a alone goes past its part: shared again
                rec.reset_peaks()
                assert await burst([a], [chat(tokens=8) for _ in range(8)]) == [200] * 8
                assert rec.peaks["serving"] <= 4
                if rec.peaks["serving"] > 2:
                    break
    assert all(s <= 4 for _, _, s in rec.log)
