"""The wire-path bench serves real requests through the router's own server, whole and streamed,
and refuses to report a run in which the client did not get every answer."""

from __future__ import annotations

import pytest

from router.lab.bench.wirepath import TOKENS, main, run


@pytest.mark.parametrize("kind", ["whole", "stream"])
def test_the_bench_serves_every_request(kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([kind, "3"]) == 0
    assert capsys.readouterr().out.startswith(f"{kind}: ")


def test_streams_carry_every_token_through_several_connections() -> None:
    result = run(6, stream=True, concurrency=2)
    assert (result["requests"], result["errors"], result["chunks"]) == (6, 0, 6 * TOKENS)
