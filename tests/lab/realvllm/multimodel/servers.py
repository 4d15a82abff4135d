"""The two servers of the several-models tests.

- A serves `tiny` with LoRA enabled: the adapter `tiny-lora` from start-up (`--lora-modules`)
  and room for more loaded at run time (`VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`).
- B serves `tiny-b`, an unrelated model (its own tokenizer, vocabulary and shape).
"""

from __future__ import annotations

import os
from pathlib import Path

from router.config.models import PoolConfig
from router.config.render import pool_serve_args
from router.lab.procs import free_ports
from router.lab.realvllm.install import VllmInstall
from router.lab.realvllm.server import VllmServer
from tests.lab.realvllm.multimodel.profile import ADAPTER, MODEL_A, MODEL_B, SERVER_KEYS, pool_vllm

# vLLM's LoRA flags for server A: two adapters in the batch at once, rank up to the built one's.
LORA_FLAGS = ("--enable-lora", "--max-loras", "2", "--max-lora-rank", "8")
RUNTIME_LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}


def rendered_args(model: str, url: str) -> tuple[str, ...]:
    """The server flags a pool serving `model` with the package's `vllm:` block renders to."""
    pool = PoolConfig.model_validate({"model": model, "backends": [url], "vllm": pool_vllm()})
    return pool_serve_args(pool, device="cpu").args


def two_servers(install: VllmInstall, workdir: Path) -> tuple[VllmServer, VllmServer]:
    cores = sorted(os.sched_getaffinity(0))
    port_a, port_b = free_ports(2)
    lora = (*LORA_FLAGS, "--lora-modules", f"{ADAPTER}={install.model(ADAPTER)}")
    a = VllmServer(
        venv=install.venv, model=install.model(MODEL_A), port=port_a, api_key=SERVER_KEYS[MODEL_A],
        workdir=workdir, cache=install.cache, core=cores[0],
        args=(*rendered_args(MODEL_A, f"http://127.0.0.1:{port_a}"), *lora),
        environ={**os.environ, **RUNTIME_LORA_ENV},
    )  # fmt: skip
    b = VllmServer(
        venv=install.venv, model=install.model(MODEL_B), port=port_b, api_key=SERVER_KEYS[MODEL_B],
        workdir=workdir, cache=install.cache, core=cores[1 % len(cores)],
        args=rendered_args(MODEL_B, f"http://127.0.0.1:{port_b}"),
    )  # fmt: skip
    return a, b
