"""A pool's `vllm:` block as `vllm serve` arguments, for the version the pool declares.

Version-aware: flags a version does not have are an error, never silently dropped (the partial
prefill limits left vLLM in 0.27; the router's own admission enforces them on newer versions).
The same arguments start the real servers of the test suite and the rendered deployments."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from router.balance import BalanceSettings, places_on_token_ids
from router.config.models import KVEventsConfig, PoolConfig
from router.config.vllm import PARTIAL_PREFILL_REMOVED_IN, VllmSettings


class RenderError(ValueError):
    """The pool's settings cannot be expressed for its vLLM version."""


@dataclass(frozen=True, slots=True)
class Rendered:
    args: tuple[str, ...]
    notes: tuple[str, ...]


# Every capacity setting is rendered explicitly, defaults included, so the server runs exactly
# the configuration that server_configuration_hash identifies.
_FLAGS: tuple[tuple[str, str], ...] = (
    ("max_model_len", "--max-model-len"),
    ("max_num_batched_tokens", "--max-num-batched-tokens"),
    ("max_num_seqs", "--max-num-seqs"),
    ("long_prefill_token_threshold", "--long-prefill-token-threshold"),
    ("stream_interval", "--stream-interval"),
    ("scheduling_policy", "--scheduling-policy"),
    ("max_num_queued_reqs", "--max-num-queued-reqs"),
    ("max_num_queued_tokens", "--max-num-queued-tokens"),
    ("max_num_active_seqs", "--max-num-active-seqs"),
    ("block_size", "--block-size"),
    ("gpu_memory_utilization", "--gpu-memory-utilization"),
    ("tensor_parallel_size", "--tensor-parallel-size"),
    ("pipeline_parallel_size", "--pipeline-parallel-size"),
    ("data_parallel_size", "--data-parallel-size"),
    ("dtype", "--dtype"),
    ("kv_cache_dtype", "--kv-cache-dtype"),
)
_PARTIAL_FLAGS = (
    ("max_num_partial_prefills", "--max-num-partial-prefills"),
    ("max_long_partial_prefills", "--max-long-partial-prefills"),
)
# Flags that newer releases added: rendering them for an older version is an error.
_ADDED_IN = {
    "--stream-interval": (0, 11),
    "--max-num-queued-reqs": (0, 28),
    "--max-num-queued-tokens": (0, 28),
    "--max-num-active-seqs": (0, 28),
}
# Device-specific settings that a CPU build does not take.
_GPU_ONLY = frozenset({"gpu_memory_utilization"})


Device = Literal["gpu", "cpu"]


def vllm_serve_args(v: VllmSettings, *, served_model: str, device: Device = "gpu") -> Rendered:
    """Scheduler and capacity flags only: the model path, host, port and key are the launcher's."""
    version = v.version_tuple
    args: list[str] = ["--served-model-name", served_model]
    for field, flag in _FLAGS:
        value = getattr(v, field)
        if value is None or (field in _GPU_ONLY and device == "cpu"):
            continue
        added = _ADDED_IN.get(flag)
        if added is not None and version < added:
            raise RenderError(f"{field}: {flag} does not exist in vLLM {v.version}")
        args += [flag, str(value)]
    args.append("--enable-prefix-caching" if v.enable_prefix_caching else "--no-enable-prefix-caching")
    args.append("--enable-chunked-prefill" if v.enable_chunked_prefill else "--no-enable-chunked-prefill")
    for field, flag in _PARTIAL_FLAGS:
        value = getattr(v, field)
        if value is None:
            continue
        if version >= PARTIAL_PREFILL_REMOVED_IN:
            raise RenderError(f"{field}: {flag} was removed in vLLM 0.27 (pool declares {v.version})")
        args += [flag, str(value)]
    args += list(v.extra_args)
    return Rendered(tuple(args), ())


DEFAULT_KV_PORT = 5557
DEFAULT_KV_REPLAY_PORT = 5558


@dataclass(frozen=True, slots=True)
class KVPorts:
    """The ports an engine publishes its KV events on: rank r of a data-parallel engine binds
    port + r (and replay + r), as vLLM does."""

    port: int
    replay_port: int | None
    ranks: int

    def all(self) -> tuple[int, ...]:
        bases = (self.port,) if self.replay_port is None else (self.port, self.replay_port)
        return tuple(base + rank for base in bases for rank in range(self.ranks))


def kv_ports(pool: PoolConfig, balances: Iterable[BalanceSettings]) -> KVPorts | None:
    """The publisher an engine of the pool must run, when the router follows the pool's events:
    when `kv_events.follow` says so, else when a lane of the pool places on token ids. Pools
    found by discovery publish on the default ports, which the engine then lists itself."""
    cfg = pool.kv_events or KVEventsConfig()
    follow = cfg.follow
    if follow is None:
        follow = any(places_on_token_ids(b) for b in balances)
    if not follow:
        return None
    if cfg.port is None:
        return KVPorts(DEFAULT_KV_PORT, DEFAULT_KV_REPLAY_PORT, 1)
    return KVPorts(cfg.port, cfg.replay_port, cfg.data_parallel_size)


def kv_events_args(ports: KVPorts) -> tuple[str, ...]:
    """vLLM's flags for it: a wildcard host, because vLLM binds a wildcard endpoint and connects
    to any other."""
    config: dict[str, object] = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{ports.port}",
    }
    if ports.replay_port is not None:
        config["replay_endpoint"] = f"tcp://*:{ports.replay_port}"
    return ("--kv-events-config", json.dumps(config, separators=(",", ":")))


def _with_kv_events(rendered: Rendered, ports: KVPorts) -> Rendered:
    # Events describe the prefix cache: without it an engine publishes nothing to place on.
    args = ["--enable-prefix-caching" if a == "--no-enable-prefix-caching" else a for a in rendered.args]
    return Rendered((*args, *kv_events_args(ports)), rendered.notes)


def pool_serve_args(pool: PoolConfig, *, device: Device = "gpu", kv: KVPorts | None = None) -> Rendered:
    rendered = vllm_serve_args(pool.vllm, served_model=pool.model, device=device)
    if kv is not None:
        rendered = _with_kv_events(rendered, kv)
    if pool.vllm.version_tuple >= PARTIAL_PREFILL_REMOVED_IN:
        if pool.admission.max_prefilling is not None:
            note = (
                f"vLLM {pool.vllm.version} has no partial-prefill flags: the router's pool admission "
                "(max_prefilling / max_long_prefilling) enforces the chunked-prefill rule instead"
            )
        else:
            note = (
                f"vLLM {pool.vllm.version} has no partial-prefill flags and the pool sets no "
                "admission.max_prefilling: nothing bounds concurrent long prefills"
            )
        rendered = Rendered(rendered.args, (*rendered.notes, note))
    if pool.aliases:
        # --served-model-name takes every name at once; the first is the canonical one.
        args = list(rendered.args)
        args[1:2] = [pool.model, *pool.aliases]
        return Rendered(tuple(args), rendered.notes)
    return rendered
