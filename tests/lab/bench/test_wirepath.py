"""The wire-path bench serves real requests through the router's own server, whole and streamed,
and refuses to report a run in which the client did not get every answer."""

from __future__ import annotations

import pytest

from router.lab.bench.wirepath import TOKENS, main, run


@pytest.mark.parametrize("kind", ["whole", "stream", "paced"])
def test_the_bench_serves_every_request(kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([kind, "3"]) == 0
    assert capsys.readouterr().out.startswith(f"{kind}: ")


def test_streams_carry_every_token_through_several_connections() -> None:
    result = run(6, stream=True, concurrency=2)
    assert (result["requests"], result["errors"], result["chunks"]) == (6, 0, 6 * TOKENS)


def test_a_paced_stream_reaches_the_router_one_write_per_read() -> None:
    # The router times a token gap per body read after a stream's first: 64 gaps for the 65
    # writes of each response only if no two writes ever shared a read.
    result = run(5, stream=True, concurrency=1, paced=True)
    assert (result["requests"], result["errors"], result["chunks"]) == (5, 0, 5 * TOKENS)
    assert result["gaps"] == 5 * TOKENS


def test_paced_streams_run_one_at_a_time() -> None:
    with pytest.raises(ValueError, match="one at a time"):
        run(2, stream=True, concurrency=2, paced=True)


def test_an_unknown_mode_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["streamed", "3"]) == 2
    assert "whole, stream, paced" in capsys.readouterr().err
