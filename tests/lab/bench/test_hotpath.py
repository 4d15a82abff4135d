"""The hot-path bench drives `handle()` over its in-memory upstream, streamed and whole; it runs
the interpreted request path only, and says so where the tree is compiled."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import router
from router.compiled import INTERPRETED_ENV, choose


def _bench(kind: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != INTERPRETED_ENV} | env
    args = [sys.executable, "-m", "router.lab.bench.hotpath", kind, "3"]
    return subprocess.run(args, env=environ, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("kind", ["whole", "stream"])
def test_the_bench_runs_the_request_path(kind: str) -> None:
    done = _bench(kind, {INTERPRETED_ENV: "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{kind}: ")


def test_the_bench_refuses_a_compiled_request_path() -> None:
    done = _bench("whole", {})
    # How the bench's own process loads, without the variable (this one may have it set).
    if choose(Path(router.__file__).parent, {}).mode == "compiled":
        assert (done.returncode, done.stdout) == (2, "")
        assert INTERPRETED_ENV in done.stderr
    else:
        assert done.returncode == 0, done.stderr
