"""A real router in front of simulated vLLM servers, all on loopback in the test's loop."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from router.config.load import parse_profile
from router.lab.sim.config import EngineConfig
from router.lab.sim.engine import Engine
from router.lab.sim.profile import engine_config
from router.lab.sim.serve import EngineSpec, SimCluster
from router.lab.sim.server import ServerSettings
from router.lab.sim.timing import StepTimeModel, load_preset
from router.server import build_state
from router.state.live import RouterState
from tests.support.servers import server_group

# Fast enough that tests finish quickly, slow enough that steps are visible on a busy machine.
QUICK = StepTimeModel(c0=0.004, c_prefill=2e-6, c_decode=1e-5, c_ctx=0.0, frontend_s=0.0)


@dataclass
class SimStack:
    url: str
    engines: list[Engine]
    backend_urls: list[str]
    state: RouterState
    profile: dict[str, Any]

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=30, **kwargs)


def rewrite_backends(data: dict[str, Any], urls: list[str]) -> dict[str, Any]:
    """The profile with its backends, in order of appearance, replaced by `urls`."""
    data = copy.deepcopy(data)
    it = iter(urls)
    for pool in data["pools"].values():
        pool["backends"] = [next(it) for _ in pool["backends"]]
    return data


def specs_for(data: dict[str, Any], timing: StepTimeModel | None = None, **engine: Any) -> list[EngineSpec]:
    """One port-0 engine per backend of the profile, configured from its pool's `vllm:` block."""
    preset = load_preset("h100-llama3-8b")
    specs = []
    for pool in data["pools"].values():
        config: EngineConfig = engine_config(preset, pool.get("vllm", {}), **engine)
        names = (pool["model"], *pool.get("aliases", ()))
        settings = ServerSettings(served_model_names=names)
        specs += [EngineSpec(0, config, timing or QUICK, settings) for _ in pool["backends"]]
    return specs


@contextlib.asynccontextmanager
async def sim_stack(
    data: dict[str, Any],
    timing: StepTimeModel | None = None,
    adjust: Callable[[dict[str, Any]], None] | None = None,
    **engine: Any,
) -> AsyncIterator[SimStack]:
    async with SimCluster(specs_for(data, timing, **engine)) as cluster, server_group() as group:
        live = rewrite_backends(data, cluster.urls)
        if adjust is not None:
            adjust(live)
        state = build_state(parse_profile(live), None)
        url = await group.serve_router(state)
        yield SimStack(url, cluster.engines, cluster.urls, state, live)
