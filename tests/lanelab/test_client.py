"""The lab's clients and simulated stack, against in-process simulated servers."""

from __future__ import annotations

from router.lanelab.client import slow_stream, stream
from router.lanelab.run import summary
from router.lanelab.stack import simulated
from router.lanelab.workloads import body
from router.proxy.upstream import UpstreamPool
from router.sim.config import EngineConfig
from router.sim.timing import StepTimeModel

TIMING = StepTimeModel(c0=0.002, c_prefill=1e-6, c_decode=1e-5, c_ctx=0.0)
CONFIG = EngineConfig(max_model_len=4096, max_num_batched_tokens=2048, max_num_seqs=16, num_gpu_blocks=1024)


async def test_a_stream_is_timed_and_its_usage_read() -> None:
    async with simulated([CONFIG], TIMING, "m") as sims:
        pool = UpstreamPool(sims.urls[0])
        try:
            result = await stream(
                pool, body("m", [{"role": "user", "content": "hello"}], 20), [], "t", "rid-1"
            )
        finally:
            await pool.aclose()
        assert result.ok and result.done_marker and result.tokens_reported == 20
        assert result.ttft is not None and result.ttft > 0 and len(result.gaps) >= 10
        assert sims.finished("rid-1") is not None and sims.finished("other") is None
        assert summary([result])["ok"] == 1.0


async def test_a_slow_reader_gets_every_token_at_its_own_pace() -> None:
    async with simulated([CONFIG], TIMING, "m") as sims:
        payload = body("m", [{"role": "user", "content": "hello"}], 300)
        result = await slow_stream(sims.urls[0], payload, [], "slow", "rid-2", bytes_per_s=100_000)
        finished = sims.finished("rid-2")
    assert result.ok and result.done_marker and result.tokens_reported == 300
    assert result.text_chars == 4 * 300
    assert result.ended is not None and finished is not None
    assert result.ended - result.started > result.body_bytes / 100_000 * 0.8
