"""Backend load from vLLM's own /metrics, for the balance strategies that read it.

`parse_vllm_load` reads the few gauges that matter from the Prometheus text format
(`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`, or the
older `vllm:gpu_cache_usage_perc`), summed over engines (data parallel ranks) and, for the KV
usage, averaged. `apply_sample` stores a sample on the backend together with the router's own
in-flight count at that moment, which `router.balance.corrected_load` uses to correct the sample
between scrapes. `LoadScraper` is the I/O edge: it polls the backends of every pool that has a
lane whose strategy reads scraped load (router/balance/), on the profile's `scrape.interval_s`,
each GET bounded in time and bytes (`router.fleet.probes`); a page too large or too slow is no sample.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from router.balance import scrapes_load
from router.fleet.backend import Backend
from router.fleet.pool import Pool
from router.fleet.probes import METRICS_BYTES, ProbeClient
from router.state.runtime import Runtime

log = logging.getLogger("lane_router.scrape")

_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_WANTED = (_RUNNING, _WAITING, *_KV)


@dataclass(frozen=True, slots=True)
class LoadSample:
    running: float
    waiting: float
    kv_usage: float


def parse_vllm_load(text: str) -> LoadSample | None:
    """The load gauges of a vLLM /metrics page; None when it has none of them."""
    sums = dict.fromkeys(_WANTED, 0.0)
    counts = dict.fromkeys(_WANTED, 0)
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        brace = line.find("{")
        name = line[:brace] if brace >= 0 else line.split(None, 1)[0]
        if name not in sums:
            continue
        rest = line[line.rfind("}") + 1 :] if brace >= 0 else line[len(name) :]
        try:
            value = float(rest.split()[0])
        except (ValueError, IndexError):
            continue
        sums[name] += value
        counts[name] += 1
    if not any(counts.values()):
        return None
    kv_name = _KV[0] if counts[_KV[0]] else _KV[1]
    kv = sums[kv_name] / counts[kv_name] if counts[kv_name] else 0.0
    return LoadSample(running=sums[_RUNNING], waiting=sums[_WAITING], kv_usage=kv)


def apply_sample(backend: Backend, sample: LoadSample | None) -> None:
    if sample is None:
        backend.scraped = False
        return
    backend.scraped = True
    backend.scraped_running = sample.running
    backend.scraped_waiting = sample.waiting
    backend.scraped_kv_usage = sample.kv_usage
    backend.in_flight_at_scrape = backend.in_flight


def scraped_pools(runtime: Runtime) -> list[Pool]:
    """Pools whose load someone reads: those with a lane whose strategy reads scraped load."""
    names = {lane.pool.name for lane in runtime.lanes.values() if scrapes_load(lane.config.balance)}
    return [runtime.pools[name] for name in sorted(names)]


class LoadScraper:
    """Polls the load of the current runtime's scraped pools until stopped."""

    def __init__(self, current: Callable[[], Runtime]) -> None:
        self._current = current
        self._probes = ProbeClient()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="lane-router-scrape")

    async def stop(self) -> None:
        try:
            if self._task is not None:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
        finally:
            await self._probes.aclose()

    async def _loop(self) -> None:
        while True:
            runtime = self._current()
            pools = scraped_pools(runtime)
            await self.scrape(pools, runtime.config.scrape.timeout_s)
            await asyncio.sleep(runtime.config.scrape.interval_s)

    async def scrape(self, pools: list[Pool], timeout: float) -> None:
        await asyncio.gather(*(self._one(pool, b, timeout) for pool in pools for b in pool.backends))

    async def _one(self, pool: Pool, backend: Backend, timeout: float) -> None:
        headers = {"authorization": "Bearer " + pool.upstream_key.decode()} if pool.upstream_key else {}
        url = backend.name + "/metrics"
        answer = await self._probes.get(pool.tls, url, cap=METRICS_BYTES, timeout=timeout, headers=headers)
        sample = None
        if answer is not None and answer.status == 200:
            sample = parse_vllm_load(answer.body.decode("utf-8", "replace"))
        apply_sample(backend, sample)
