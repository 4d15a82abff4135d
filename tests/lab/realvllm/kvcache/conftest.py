"""The KV-event server pair (tests/lab/realvllm/kvcache/pair.py), started once for this package:
both at once, one CPU core each, stopped when the package's last test ends (before the other
real-vLLM tests start theirs)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.lab.procs import free_ports
from router.lab.realvllm.install import VllmInstall
from router.lab.realvllm.server import VllmServer
from tests.lab.realvllm.conftest import START_TIMEOUT_S, require_install
from tests.lab.realvllm.kvcache.pair import KEY, KVPair, KVServer, event_sources, rendered_args


def pair_server(install: VllmInstall, workdir: Path, port: int, core: int) -> VllmServer:
    return VllmServer(
        venv=install.venv, model=install.model("tiny"), port=port, api_key=KEY, workdir=workdir,
        cache=install.cache, core=core, args=rendered_args(f"http://127.0.0.1:{port}"),
    )  # fmt: skip


@pytest.fixture(scope="package")
def kv_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KVPair]:
    install = require_install()
    workdir = tmp_path_factory.mktemp("vllm-kv-pair")
    cores = sorted(os.sched_getaffinity(0))
    ports = free_ports(2)
    servers = [pair_server(install, workdir, port, cores[i % len(cores)]) for i, port in enumerate(ports)]
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        for server in servers:
            stack.callback(server.stop)
            server.start()
        for server in servers:
            server.wait_healthy(START_TIMEOUT_S)
        took = time.monotonic() - began
        # Shown with -s and in CI logs: the start-up is what this package adds to a run.
        print(f"\nreal vLLM, KV events: 2 servers healthy in {took:.0f}s", file=sys.stderr)
        a, b = (KVServer(s, *event_sources(s)) for s in servers)
        yield KVPair((a, b), took)
