"""The hot-path bench drives `handle()` over its in-memory upstream, streamed and whole."""

from __future__ import annotations

import pytest

from router.lab.bench.hotpath import main


@pytest.mark.parametrize("kind", ["whole", "stream"])
def test_the_bench_runs_the_request_path(kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([kind, "3"]) == 0
    assert capsys.readouterr().out.startswith(f"{kind}: ")
