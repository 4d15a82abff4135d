from __future__ import annotations

from pathlib import Path

import pytest

from router.lab.sim.calibrate import calibrate_to_file
from router.lab.sim.config import EngineConfig
from router.lab.sim.fitting import (
    CalibrationError,
    Measurements,
    fit,
    least_squares,
    nonnegative_least_squares,
)
from router.lab.sim.serve import EngineSpec, SimCluster
from router.lab.sim.server import ServerSettings
from router.lab.sim.timing import StepTimeModel, load_preset
from router.lab.sim.virtualtime import run_in_virtual_time

TRUE = StepTimeModel(c0=0.015, c_prefill=4e-5, c_decode=0.002, c_ctx=2e-6, frontend_s=0.006, c_attn=3e-8)


def test_least_squares_recovers_exact_coefficients() -> None:
    rows = [[1.0, x, x * x] for x in (0.0, 1.0, 2.0, 5.0)]
    ys = [3 + 2 * x - 0.5 * x * x for _, x, _ in rows]
    assert least_squares(rows, ys) == pytest.approx([3, 2, -0.5])
    assert nonnegative_least_squares(rows, ys)[2] == 0.0


def test_fit_inverts_the_model_on_exact_points() -> None:
    m = Measurements(model="m", max_model_len=4096)
    for b, ctx in ((1, 50), (4, 50), (16, 50), (8, 1000)):
        m.decode.append((b, b, ctx, TRUE.step_time(0, b, b * ctx)))
    for p in (16, 256, 1024, 1536):
        m.prefill.append((p, TRUE.frontend_s + TRUE.prefill_time(p)))
    got = fit(m)
    for name in ("c0", "c_prefill", "c_decode", "c_ctx", "frontend_s", "c_attn"):
        assert getattr(got, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name


def test_fit_uses_the_batch_the_server_ran_not_the_streams_sent() -> None:
    m = Measurements(model="m", max_model_len=4096)
    for sent, ran, ctx in ((1, 1, 50), (4, 4, 50), (16, 16, 50), (32, 16, 50), (8, 8, 1000)):
        m.decode.append((sent, ran, ctx, TRUE.step_time(0, ran, ran * ctx)))
    m.prefill += [(p, TRUE.prefill_time(p)) for p in (16, 512, 1024)]
    assert fit(m).c_decode == pytest.approx(TRUE.c_decode, rel=0.05)


def test_fit_refuses_too_few_points() -> None:
    with pytest.raises(CalibrationError):
        fit(Measurements(model="m", max_model_len=4096))


def test_calibrating_against_a_simulated_server_recovers_its_timing(tmp_path: Path) -> None:
    # In virtual time: what calibration measures is the server's timing model, not the host's load.
    run_in_virtual_time(_calibrate_against_a_simulated_server(tmp_path))


async def _calibrate_against_a_simulated_server(tmp_path: Path) -> None:
    # max_num_seqs below the 16-stream probe: calibration must see that only 8 ran at once.
    config = EngineConfig(
        max_model_len=4096,
        max_num_batched_tokens=4096,
        max_num_seqs=8,
        num_gpu_blocks=3000,
        version="0.31.1",
    )
    spec = EngineSpec(
        port=0,
        config=config,
        timing=TRUE,
        settings=ServerSettings(served_model_names=("probe-model",), api_key="k"),
    )
    out = tmp_path / "fitted.yaml"
    async with SimCluster([spec]) as cluster:
        preset = await calibrate_to_file(cluster.urls[0], out, api_key="k", name="fitted", quick=True)
    got = preset.timing
    text = out.read_text()
    assert "#     16    8 " in text  # 16 streams sent, 8 run at once
    assert "server tokens per simulator token on plain text: 1.000" in text
    assert got.c0 == pytest.approx(TRUE.c0, rel=0.05)
    assert got.c_decode == pytest.approx(TRUE.c_decode, rel=0.05)
    assert got.c_ctx == pytest.approx(TRUE.c_ctx, rel=0.1)
    # Prefill and frontend share the TTFT line; check the line.
    for p in (16, 1024):
        want = TRUE.frontend_s + TRUE.prefill_time(p)
        line = got.frontend_s + got.admission_cost(p) + got.output_cost(1) + got.prefill_time(p)
        assert line == pytest.approx(want, rel=0.05)
    # The written file is a loadable preset that carries the server's own facts.
    loaded = load_preset(str(out))
    assert loaded.name == "fitted" and loaded.model == "probe-model"
    assert loaded.engine.max_model_len == 4096 and loaded.engine.num_gpu_blocks == 3000
    assert loaded.engine.version == "0.31.1"
    assert loaded.timing == got
