"""The simulator beside a real vLLM: what does not depend on how busy the machine is.

Latency faithfulness depends on the host's load and is measured by hand (`lane-router sim
compare`, docs/sim.md). Here: calibration reads the real server's own facts, and the simulated
prefix cache — same block size, same requests — hits as often as vLLM's. Both take seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from router.lab.realvllm.server import VllmServer
from router.lab.sim.calibrate import calibrate_to_file
from router.lab.sim.compare import prefix_workload, run_workload
from router.lab.sim.config import EngineConfig
from router.lab.sim.serve import EngineSpec, SimCluster
from router.lab.sim.server import ServerSettings
from router.lab.sim.timing import StepTimeModel, load_preset
from tests.lab.realvllm.pools import MAX_MODEL_LEN, MODEL_NAME, POOL_VLLM

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]

HIT_RATE_POINTS = 0.10
# Any timing will do: the hit rate depends on the requests and the block size, not on speed.
TIMING = StepTimeModel(c0=0.002, c_prefill=2e-5, c_decode=1e-4, c_ctx=1e-8, frontend_s=0.001)


def _sim_like(pool: str) -> EngineSpec:
    vllm = POOL_VLLM[pool]
    config = EngineConfig(
        max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=vllm["max_num_batched_tokens"],
        max_num_seqs=vllm["max_num_seqs"],
        block_size=vllm["block_size"],
        num_gpu_blocks=4096,
    )
    return EngineSpec(port=0, config=config, timing=TIMING, settings=ServerSettings((MODEL_NAME,)))


@pytest.mark.parametrize("concurrency", [1, 4])
async def test_simulated_prefix_cache_hits_as_often_as_vllm(vllm_a: VllmServer, concurrency: int) -> None:
    # Fresh documents per case (seeded by concurrency): nothing is cached from an earlier one.
    jobs = prefix_workload(docs=5, questions=4, seed=100 + concurrency)
    async with SimCluster([_sim_like("interactive")]) as cluster:
        sim = await run_workload(cluster.urls[0], jobs, concurrency=concurrency)
    real = await run_workload(vllm_a.url, jobs, concurrency=concurrency, api_key=vllm_a.api_key)
    assert real.requests == sim.requests == len(jobs)
    assert real.hit_rate > 0.3  # the workload does repeat its documents
    assert abs(real.hit_rate - sim.hit_rate) <= HIT_RATE_POINTS, (real.hit_rate, sim.hit_rate)


async def test_calibration_records_the_real_servers_facts(vllm_a: VllmServer, tmp_path: Path) -> None:
    out = tmp_path / "real.yaml"
    preset = await calibrate_to_file(vllm_a.url, out, api_key=vllm_a.api_key, name="real", quick=True)
    loaded = load_preset(str(out))
    assert loaded == preset
    engine = preset.engine
    assert (engine.block_size, engine.max_model_len) == (
        POOL_VLLM["interactive"]["block_size"],
        MAX_MODEL_LEN,
    )
    assert engine.version == POOL_VLLM["interactive"]["version"]
    # float32 KV of the tiny model: 2 layers x 4 heads x 32 dims x (K, V) x 4 bytes = 2 KiB a
    # token, so the 1 GiB cache holds 524,288 tokens = 4,096 blocks of 128.
    assert engine.num_gpu_blocks == 4096
    text = out.read_text()
    # The tiny model's 2,048-word tokenizer cuts plain text finer than 4 characters a token.
    ratio = float(text.split("server tokens per simulator token on plain text: ")[1].split()[0])
    assert ratio > 1.5
    t = preset.timing
    # Every coefficient is a cost, and a decode step over a short context takes time. How a quick
    # calibration splits that time between the step's fixed part (c0), its per-sequence part and
    # its per-context-token part is not pinned by its few probes: on a busy machine the fit can
    # put all of it in any one of them.
    assert min(t.c0, t.c_prefill, t.c_decode, t.c_ctx, t.c_attn) >= 0
    assert t.step_time(prefill_tokens=0, decode_seqs=1, attended_tokens=64) > 0
    assert t.prefill_time(256) > 0
    # vLLM reports its queue and prefill histograms, so the burst probes of its API server ran
    # and were read. (A quick calibration's few probes do not pin the serial costs: their fit
    # is checked on simulated probes in tests/lab/sim/test_frontend.py.)
    assert "frontend probes:" in text
