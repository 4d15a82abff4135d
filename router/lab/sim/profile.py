"""Engine specs for every backend of every pool of a router profile, from the pool's `vllm:`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from router.config.models import PoolConfig, ProfileConfig
from router.lab.sim.config import EngineConfig
from router.lab.sim.serve import EngineSpec
from router.lab.sim.server import ServerSettings
from router.lab.sim.timing import Preset

_LOCAL_HOSTS = {"127.0.0.1", "localhost", "0.0.0.0", "::1"}


def engine_config(preset: Preset, vllm: Mapping[str, Any], **overrides: Any) -> EngineConfig:
    """The preset's engine (hardware: KV blocks, defaults) with the pool's vLLM settings on top."""
    values = {**preset.engine.as_dict(), **{k: v for k, v in vllm.items() if v is not None}}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return EngineConfig.from_mapping(values)


def pool_api_key(pool: PoolConfig) -> str | None:
    if pool.upstream_api_key:
        return pool.upstream_api_key
    if pool.upstream_api_key_env:
        return os.environ.get(pool.upstream_api_key_env) or None
    return None


# Where the simulator says an adapter the profile names without a path was loaded from.
SIM_LORA_ROOT = "/sim/lora/"


def pool_server(pool: PoolConfig) -> ServerSettings:
    """What each server of the pool serves: the model and its aliases, the adapters the profile
    names without a path as `--lora-modules` (the others are the router's to load, at run time)."""
    modules = tuple((a, SIM_LORA_ROOT + a) for a in pool.adapters if a not in pool.adapter_paths)
    return ServerSettings(
        served_model_names=(pool.model, *pool.aliases),
        api_key=pool_api_key(pool),
        lora_modules=modules,
        runtime_lora=bool(pool.adapter_paths),
    )


def profile_specs(profile: ProfileConfig, preset: Preset, **overrides: Any) -> list[EngineSpec]:
    """One spec per backend URL of every pool; the backend's host and port are where it listens.
    A pool that names an upstream key gets it as the simulated server's `--api-key`."""
    specs: list[EngineSpec] = []
    for name, pool in profile.pools.items():
        config = engine_config(preset, pool.vllm.model_dump(), **overrides)
        settings = pool_server(pool)
        for origin in pool.origins:
            parts = urlsplit(origin)
            host = parts.hostname or "127.0.0.1"
            if host not in _LOCAL_HOSTS:
                raise ValueError(f"pool {name}: backend {origin} is not on this machine")
            if parts.port is None:
                raise ValueError(f"pool {name}: backend {origin} has no port")
            specs.append(
                EngineSpec(
                    port=parts.port,
                    config=config,
                    timing=preset.timing,
                    settings=settings,
                    host="127.0.0.1" if host == "localhost" else host,
                )
            )
    return specs
