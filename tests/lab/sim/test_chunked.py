from __future__ import annotations

import pytest

from router.lab.sim.chunked import Spike, format_table, measure_spike, summarize
from router.lab.sim.config import EngineConfig
from router.lab.sim.serve import EngineSpec, SimCluster
from router.lab.sim.timing import StepTimeModel
from router.lab.sim.virtualtime import run_in_virtual_time

# One 1,200-token step (≈ 70 ms) stands far above a decode step (≈ 10 ms); cut into ten chunks of
# ≈ 124 tokens it costs ten steps of ≈ 16 ms.
TIMING = StepTimeModel(c0=0.01, c_prefill=5e-5, c_decode=1e-4, c_ctx=0.0, frontend_s=0.001)


def test_summarize_splits_gaps_by_the_prefill_windows() -> None:
    # Two decode streams, a token every 10 ms, except a 50 ms stall from t=0.2 to t=0.25.
    times = [0.01 * i for i in range(21)] + [0.25 + 0.01 * i for i in range(10)]
    spike = summarize(2048, [times, times], [(0.205, 0.245)])
    assert spike.decode_itl_worst == pytest.approx(0.05)
    assert spike.decode_itl_p50 == pytest.approx(0.01)
    assert spike.long_ttft == pytest.approx(0.04)


def test_table_has_one_row_per_budget() -> None:
    table = format_table([Spike(512, 0.002, 0.02, 0.09), Spike(None, 0.002, 0.05, 0.06)])
    assert table.splitlines()[2:] == ["| 512 | 2.0 | 20.0 | 90.0 |", "| ? | 2.0 | 50.0 | 60.0 |"]


def test_a_smaller_budget_trades_long_prompt_ttft_for_decode_itl() -> None:
    # In virtual time: the gaps measured are the engine's steps, not the host's scheduling.
    run_in_virtual_time(_smaller_budget_trades_long_prompt_ttft_for_decode_itl())


async def _smaller_budget_trades_long_prompt_ttft_for_decode_itl() -> None:
    results = {}
    for budget in (2048, 128):
        config = EngineConfig(max_model_len=2048, max_num_batched_tokens=budget, max_num_seqs=16)
        async with SimCluster([EngineSpec(port=0, config=config, timing=TIMING)]) as cluster:
            results[budget] = await measure_spike(cluster.urls[0], decodes=4, long=1200, repeats=2)
    whole, chunked = results[2048], results[128]
    # One step with the whole prompt stalls every decode for that step.
    assert whole.decode_itl_worst == pytest.approx(TIMING.step_time(1200, 4, 0), rel=0.05)
    assert chunked.decode_itl_worst < whole.decode_itl_worst / 2
    assert chunked.long_ttft > 1.5 * whole.long_ttft
    assert whole.decode_itl_p50 == pytest.approx(chunked.decode_itl_p50, rel=0.05)
