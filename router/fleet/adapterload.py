"""Loading a LoRA adapter on a backend on demand: vLLM's `POST /v1/load_lora_adapter`
(`{"lora_name", "lora_path"}`, allowed by the server's `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`),
with the pool's upstream key and TLS.

Only adapters the profile names with a path are loaded (`adapters: [{name, path}]`), from that
path: nothing a client sends reaches the load. One load per (backend, adapter) runs at a time;
the requests that need it meanwhile wait for that one. A loaded adapter makes its backend a
holder at once (router/fleet/adapters.py), until the backend's next `/v1/models` says otherwise.
vLLM refuses to load a name it already serves (400, "already been loaded"): that counts as
loaded, since another router replica, or an operator, may have loaded it first."""

from __future__ import annotations

import asyncio
import logging

import orjson

from router.errors import AdapterLoadFailed
from router.fleet.adapters import AdapterNeed, serves
from router.fleet.backend import Backend
from router.fleet.probes import HEALTH_BYTES, Answer, ProbeClient
from router.observe.metrics import Metrics
from router.tls.upstream import UpstreamTls

log = logging.getLogger("lane_router.adapters")

LOAD_PATH = "/v1/load_lora_adapter"


class AdapterLoads:
    """The loads under way, by backend and adapter name."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._probes = ProbeClient()
        self._running: dict[tuple[Backend, str], asyncio.Task[None]] = {}

    def running(self, backend: Backend, name: str) -> bool:
        return (backend, name) in self._running

    async def ensure(
        self,
        backend: Backend,
        need: AdapterNeed,
        *,
        key: bytes | None,
        tls: UpstreamTls | None,
        timeout: float,
    ) -> bool:
        """The adapter is held by `backend` once this returns: True when it had to be loaded
        (here, or by a load another request started); `AdapterLoadFailed` when it could not be.
        A waiter that gives up (its client went away) leaves the load running for the others."""
        if serves(backend, need):
            return False
        entry = (backend, need.name)
        task = self._running.get(entry)
        if task is None:
            task = asyncio.create_task(self._load(backend, need, key, tls, timeout), name="lora-load")
            self._running[entry] = task
            backend.loading = backend.loading | {need.name}
            task.add_done_callback(lambda done: self._ended(entry, done))
        await asyncio.shield(task)
        return True

    def _ended(self, entry: tuple[Backend, str], task: asyncio.Task[None]) -> None:
        if self._running.get(entry) is task:
            del self._running[entry]
            backend, name = entry
            backend.loading = backend.loading - {name}
        if not task.cancelled():
            task.exception()  # retrieved: every waiter may have gone

    async def _load(
        self, backend: Backend, need: AdapterNeed, key: bytes | None, tls: UpstreamTls | None, timeout: float
    ) -> None:
        path = need.path
        if path is None:
            raise AdapterLoadFailed(f"adapter {need.name!r} has no path to load it from")
        headers = {"authorization": "Bearer " + key.decode("latin-1")} if key else {}
        body = orjson.dumps({"lora_name": need.name, "lora_path": path})
        answer = await self._probes.post(
            tls, backend.name + LOAD_PATH, body, cap=HEALTH_BYTES, timeout=timeout, headers=headers
        )
        loaded = answer is not None and (answer.status == 200 or _already_loaded(answer))
        self._metrics.adapter_loads.labels(backend.pool, "loaded" if loaded else "failed").inc()
        if not loaded:
            raise _failure(backend, need, answer)
        log.info("loaded adapter %s on backend %s of pool %s", need.name, backend.name, backend.pool)
        served = backend.served or frozenset()
        backend.served = served | {need.name}

    async def aclose(self) -> None:
        running = list(self._running.values())
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await self._probes.aclose()


def _already_loaded(answer: Answer) -> bool:
    return answer.status == 400 and b"already been loaded" in answer.body


def _failure(backend: Backend, need: AdapterNeed, answer: Answer | None) -> AdapterLoadFailed:
    """What the client is told (the backend by its label; vLLM's own message, which may name
    the path, only in the log)."""
    if answer is None:
        what = "did not answer in time"
        log.warning("loading adapter %s on backend %s: no answer", need.name, backend.name)
    else:
        what = f"refused it (HTTP {answer.status})"
        log.warning(
            "loading adapter %s on backend %s: HTTP %d %s",
            need.name,
            backend.name,
            answer.status,
            answer.body[:500].decode("utf-8", "replace"),
        )
    return AdapterLoadFailed(f"{backend.label} could not load adapter {need.name!r}: it {what}")
