from __future__ import annotations

import pytest

from router.sim.compare import Observed, compare, mixed_workload, run_workload
from router.sim.config import EngineConfig
from router.sim.serve import EngineSpec, SimCluster
from router.sim.timing import StepTimeModel
from router.tokens import estimate_text_tokens


def test_workload_is_seeded_and_fits_the_context() -> None:
    a, b = mixed_workload(30, seed=4, max_model_len=2048), mixed_workload(30, seed=4, max_model_len=2048)
    assert a == b and a != mixed_workload(30, seed=5, max_model_len=2048)
    assert all(estimate_text_tokens(x["prompt"]) + x["max_tokens"] <= 2048 for x in a)


def test_compare_applies_both_tolerances() -> None:
    real = Observed(0.100, 0.200, 0.010, 0.020, 0.40, 10)
    close = Observed(0.120, 0.240, 0.0085, 0.024, 0.48, 10)
    far = Observed(0.130, 0.200, 0.010, 0.020, 0.55, 10)
    assert all(c.ok for c in compare(real, close))
    bad = {c.name for c in compare(real, far) if not c.ok}
    assert bad == {"ttft_p50", "hit_rate"}


async def test_two_identical_simulators_agree_and_a_slower_one_does_not() -> None:
    config = EngineConfig(max_model_len=2048, max_num_batched_tokens=2048, num_gpu_blocks=4096)
    base = StepTimeModel(c0=0.008, c_prefill=2e-5, c_decode=2e-4, c_ctx=1e-7, frontend_s=0.003)
    slow = StepTimeModel(c0=0.016, c_prefill=4e-5, c_decode=4e-4, c_ctx=2e-7, frontend_s=0.006)
    bodies = mixed_workload(18, seed=1, max_model_len=2048)
    specs = [EngineSpec(port=0, config=config, timing=t) for t in (base, base, slow)]
    async with SimCluster(specs) as cluster:
        ref, twin, slower = [await run_workload(u, bodies, concurrency=3) for u in cluster.urls]
    assert ref.hit_rate > 0.1  # the RAG documents repeat
    assert [c.name for c in compare(ref, twin) if not c.ok] == []
    assert {c.name for c in compare(ref, slower) if not c.ok} >= {"itl_p50", "ttft_p50"}
    assert slower.itl_p50 == pytest.approx(2 * ref.itl_p50, rel=0.3)
