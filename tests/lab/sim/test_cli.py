from __future__ import annotations

import asyncio
import os
import signal
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from router.cli import parse_args
from router.config.load import parse_profile
from router.lab.procs import free_ports
from router.lab.sim.cli import build_specs, parse_ports
from router.lab.sim.config import EngineConfig
from router.lab.sim.frontendfit import BurstPoint, modelled_overheads
from router.lab.sim.profile import profile_specs
from router.lab.sim.serve import EngineSpec, SimCluster
from router.lab.sim.server import ServerSettings
from router.lab.sim.timing import StepTimeModel, load_preset, preset_names
from tests.support.servers import free_port


def test_packaged_presets_load_and_validate() -> None:
    assert {"h100-llama3-8b", "cpu-tiny"} <= set(preset_names())
    h100 = load_preset("h100-llama3-8b")
    assert h100.engine.num_gpu_blocks == 27928 and h100.engine.max_model_len == 8192
    # The small-batch decode floor the preset is derived from: ≈5–6 ms.
    assert 0.005 <= h100.timing.step_time(0, 1, 1000) <= 0.0065
    # cpu-tiny is a calibration record: its comment block lists the real server's measured
    # decode steps and prefill TTFTs, and its fitted model must reproduce them.
    tiny = load_preset("cpu-tiny")
    decode, prefill, round_trip = _recorded_probes("cpu-tiny")
    assert len(decode) >= 5 and len(prefill) >= 4
    for batch, ctx, measured in decode:
        assert tiny.timing.step_time(0, batch, round(batch * ctx)) == pytest.approx(measured, rel=0.25)
    t = tiny.timing
    for prompt, measured in prefill:
        modelled = (
            round_trip + t.frontend_s + t.admission_cost(prompt) + t.output_cost(1) + t.prefill_time(prompt)
        )
        assert modelled == pytest.approx(measured, rel=0.25)
    # The burst probes of its API server, and what this preset's frontend makes of them.
    bursts = _recorded_bursts("cpu-tiny")
    assert len(bursts) >= 4
    points = [BurstPoint(k, n, p, measured) for k, n, p, measured, _ in bursts]
    recorded = [model for *_, model in bursts]
    assert modelled_overheads(t, tiny.engine, points, round_trip) == pytest.approx(recorded, abs=2e-6)
    assert tiny.engine.block_size == 128  # vLLM's CPU default, as the real server ran
    with pytest.raises(ValueError, match="unknown preset"):
        load_preset("nope")


def _recorded_probes(name: str) -> tuple[list[tuple[int, float, float]], list[tuple[int, float]], float]:
    """(batch, context, step s), (prompt, TTFT s) and the round trip from a preset's comments."""
    text = (resources.files("router.lab.sim") / "presets" / f"{name}.yaml").read_text()
    decode: list[tuple[int, float, float]] = []
    prefill: list[tuple[int, float]] = []
    round_trip, section = 0.0, ""
    for line in text.splitlines():
        if line.startswith(("# decode probes", "# prefill probes", "# frontend probes")):
            section = line.split()[1]
        elif line.startswith("# idle HTTP round trip:"):
            round_trip = float(line.split()[5]) / 1e3
        elif line.startswith("#  ") and section == "decode":
            _, _, ran, ctx, step, _ = line.split()
            decode.append((int(ran), float(ctx), float(step) / 1e3))
        elif line.startswith("#  ") and section == "prefill":
            _, prompt, ttft, _ = line.split()
            prefill.append((int(prompt), float(ttft) / 1e3))
    return decode, prefill, round_trip


def _recorded_bursts(name: str) -> list[tuple[int, int, int, float, float]]:
    """(streams, burst, prompt, measured s, modelled s) of a preset's frontend probes."""
    text = (resources.files("router.lab.sim") / "presets" / f"{name}.yaml").read_text()
    rows, inside = [], False
    for line in text.splitlines():
        if line.startswith("# frontend probes"):
            inside = True
        elif inside and line.startswith("#  ") and line.split()[1].isdigit():
            k, n, p, measured, model = line.split()[1:]
            rows.append((int(k), int(n), int(p), float(measured) / 1e3, float(model) / 1e3))
        elif inside and not line.startswith("#  "):
            inside = False
    return rows


def test_parse_ports() -> None:
    assert parse_ports("8101-8104") == [8101, 8102, 8103, 8104]
    assert parse_ports("8101,8105-8106") == [8101, 8105, 8106]


def test_flags_override_the_preset() -> None:
    args = parse_args(
        [
            "sim",
            "--ports",
            "9001-9002",
            "--preset",
            "cpu-tiny",
            "--max-num-seqs",
            "8",
            "--no-enable-prefix-caching",
            "--max-num-partial-prefills",
            "4",
            "--max-long-partial-prefills",
            "1",
            "--api-key",
            "k",
            "--served-model-name",
            "a",
            "b",
        ]
    )
    specs = build_specs(args)
    assert [s.port for s in specs] == [9001, 9002]
    cfg = specs[0].config
    assert cfg.max_num_seqs == 8 and not cfg.enable_prefix_caching
    assert (cfg.max_num_partial_prefills, cfg.max_long_partial_prefills) == (4, 1)
    assert cfg.num_gpu_blocks == load_preset("cpu-tiny").engine.num_gpu_blocks
    assert specs[0].settings == ServerSettings(served_model_names=("a", "b"), api_key="k")


def _profile(interactive: list[str], batch: list[str]) -> dict[str, Any]:
    return {
        "profile": "two-pools",
        "pools": {
            "interactive": {
                "backends": interactive,
                "model": "m",
                "aliases": ["m-alias"],
                "upstream_api_key_env": "SIM_TEST_POOL_KEY",
                "vllm": {
                    "max_model_len": 4096,
                    "max_num_batched_tokens": 512,
                    "max_num_seqs": 32,
                    "stream_interval": 2,
                },
            },
            "batch": {
                "backends": batch,
                "model": "m",
                "vllm": {"max_model_len": 8192, "max_num_batched_tokens": 8192},
            },
        },
        "lanes": {
            c: {"pool": "batch" if c in ("batch", "long_context") else "interactive"}
            for c in ("chat", "rag", "long_context", "agent", "batch", "slow_stream")
        },
    }


def test_profile_specs_take_each_pools_vllm_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIM_TEST_POOL_KEY", "pool-secret")
    profile = parse_profile(
        _profile(["http://127.0.0.1:9101", "http://127.0.0.1:9102"], ["http://localhost:9201"])
    )
    specs = profile_specs(profile, load_preset("h100-llama3-8b"))
    assert [(s.host, s.port) for s in specs] == [
        ("127.0.0.1", 9101),
        ("127.0.0.1", 9102),
        ("127.0.0.1", 9201),
    ]
    inter, batch = specs[0], specs[2]
    assert inter.config.max_num_batched_tokens == 512 and inter.config.stream_interval == 2
    assert inter.settings.api_key == "pool-secret"
    assert inter.settings.served_model_names == ("m", "m-alias")
    assert batch.config.max_num_batched_tokens == 8192 and batch.settings.api_key is None
    assert batch.config.num_gpu_blocks == 27928  # hardware comes from the preset


def test_remote_backends_cannot_be_simulated_here() -> None:
    profile = parse_profile(_profile(["http://10.1.2.3:9101"], ["http://127.0.0.1:9201"]))
    with pytest.raises(ValueError, match="not on this machine"):
        profile_specs(profile, load_preset("cpu-tiny"))


async def _wait_healthy(urls: list[str], proc: asyncio.subprocess.Process) -> None:
    async with httpx.AsyncClient() as c, asyncio.timeout(30):
        for url in urls:
            while True:
                assert proc.returncode is None, "the simulator exited"
                try:
                    if (await c.get(url + "/health")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.05)


async def test_sim_command_serves_every_port_and_stops_on_sigint() -> None:
    ports = free_ports(2)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "router",
        "sim",
        "--ports",
        ",".join(map(str, ports)),
        "--preset",
        "cpu-tiny",
        "--served-model-name",
        "tiny",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        await _wait_healthy(urls, proc)
        for url in urls:
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none")
            out = await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi there"}], max_tokens=3
            )
            await client.close()
            assert out.usage is not None and out.usage.completion_tokens <= 3
    finally:
        proc.send_signal(signal.SIGINT)
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, stderr.decode()
    assert stdout.decode().count("simulated vLLM") == 2


async def _calibrate(url: str, out: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "router",
        "sim",
        "calibrate",
        "--url",
        url,
        "--out",
        str(out),
        "--quick",
        "--max-num-seqs",
        "48",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ},
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, stderr.decode()
    assert "wrote" in stdout.decode()


@pytest.mark.timeout(400)
async def test_sim_calibrate_command_writes_a_preset(tmp_path: Path) -> None:
    timing = StepTimeModel(c0=0.012, c_prefill=3e-5, c_decode=0.0015, c_ctx=1e-6, frontend_s=0.004)
    spec = EngineSpec(
        port=0,
        config=EngineConfig(max_model_len=4096, num_gpu_blocks=2000, max_num_batched_tokens=4096),
        timing=timing,
    )
    out = tmp_path / "lab.yaml"
    fits: list[tuple[float, float]] = []
    async with SimCluster([spec]) as cluster:
        # The probes time a real-time engine on this machine: other work on a shared host only
        # adds time, so a measurement it spoiled is taken again (a wrong fit stays wrong).
        while len(fits) < 3:
            await _calibrate(cluster.urls[0], out)
            fitted = load_preset(str(out))
            fits.append((fitted.timing.c0, fitted.timing.c_decode))
            if fits[-1] == pytest.approx((timing.c0, timing.c_decode), rel=0.3):
                break
    assert fitted.name == "lab"
    # A limit no probe can see is recorded as given, and the command line says so.
    assert fitted.engine.max_num_seqs == 48 and "--max-num-seqs 48" in out.read_text()
    assert fitted.timing.c0 == pytest.approx(timing.c0, rel=0.3), fits
    assert fitted.timing.c_decode == pytest.approx(timing.c_decode, rel=0.3), fits


async def test_sim_calibrate_reports_an_unreachable_server(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "router",
        "sim",
        "calibrate",
        "--url",
        f"http://127.0.0.1:{free_port()}",
        "--out",
        str(tmp_path / "x.yaml"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 1
    assert "cannot list models" in stderr.decode()


def test_sim_config_errors_exit_2_with_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from router.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: {}\n")
    assert main(["sim", "--config", str(bad)]) == 2
    assert "pools" in capsys.readouterr().err
    assert main(["sim"]) == 2  # no port, no profile


async def test_sim_config_serves_every_backend_of_a_profile(tmp_path: Path) -> None:
    import yaml

    a, b = free_ports(2)
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(_profile([f"http://127.0.0.1:{a}"], [f"http://127.0.0.1:{b}"])))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "router",
        "sim",
        "--config",
        str(path),
        "--preset",
        "cpu-tiny",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "SIM_TEST_POOL_KEY": "pk"},
    )
    try:
        await _wait_healthy([f"http://127.0.0.1:{a}", f"http://127.0.0.1:{b}"], proc)
        async with httpx.AsyncClient() as c:
            models = await c.get(f"http://127.0.0.1:{a}/v1/models", headers={"Authorization": "Bearer pk"})
            assert models.json()["data"][0]["max_model_len"] == 4096
            assert (await c.get(f"http://127.0.0.1:{a}/v1/models")).status_code == 401
            other = (await c.get(f"http://127.0.0.1:{b}/v1/models")).json()
            assert other["data"][0]["max_model_len"] == 8192
    finally:
        proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0
