"""The KV-event server pair (tests/lab/realvllm/kvcache/pair.py) for this package: both at once, one
CPU core each, started ahead of the package's tests (tests/lab/realvllm/launch.py) and stopped when
its last test ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from router.lab.realvllm.server import VllmServer
from tests.lab.realvllm.conftest import START_TIMEOUT_S, require_install
from tests.lab.realvllm.kvcache.pair import KVPair, KVServer, event_sources, pair_servers
from tests.lab.realvllm.launch import serving


@pytest.fixture(scope="package")
def kv_pair(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[KVPair]:
    install = require_install()

    def make() -> list[VllmServer]:
        return pair_servers(install, tmp_path_factory.mktemp("vllm-kv-pair"))

    with serving(pytestconfig, "kv_pair", make, START_TIMEOUT_S, "KV events") as (servers, took):
        a, b = (KVServer(s, *event_sources(s)) for s in servers)
        yield KVPair((a, b), took)
