"""vLLM's own benchmark client (`vllm bench serve`) pointed at the router, with the tiny model's
tokenizer and vLLM's random dataset: every request must succeed. The summary is kept under
artifacts/vllm-bench/ and printed."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from router.lab.realvllm.vllm_bench import REPO, bench_command, bench_env
from tests.lab.realvllm.conftest import RealPools
from tests.lab.realvllm.pools import MODEL_NAME
from tests.lab.realvllm.realrouter import RealRouter, finished, finished_since
from tests.support.profiles import KEYS

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

PROMPTS = 30
ARTIFACTS = REPO / "artifacts" / "vllm-bench"
RESULT = "bench-serve.json"
BENCH_TIMEOUT_S = 300.0


def bench_args(url: str, pools: RealPools) -> list[str]:
    return [
        "--base-url", url, "--backend", "vllm", "--endpoint", "/v1/completions",
        "--model", MODEL_NAME, "--tokenizer", str(pools.install.model("tiny")),
        "--dataset-name", "random", "--random-input-len", "128", "--random-output-len", "32",
        "--num-prompts", str(PROMPTS), "--max-concurrency", "4", "--request-rate", "inf",
        "--seed", "20261129", "--temperature", "0", "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
        "--save-result", "--result-dir", str(ARTIFACTS), "--result-filename", RESULT,
    ]  # fmt: skip


def readable(output: str) -> str:
    """The run's own report, without the teardown noise of the venv's triton bindings."""
    return "\n".join(
        line
        for line in output.splitlines()
        if not line.startswith(("nanobind:", " - ", "See https://nanobind"))
    )


async def test_vllm_bench_serve_through_the_router(real_pools: RealPools, lane_router: RealRouter) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / RESULT).unlink(missing_ok=True)
    before = await finished(real_pools.servers)
    proc = await asyncio.create_subprocess_exec(
        *bench_command(real_pools.install, bench_args(lane_router.url, real_pools)),
        env=bench_env(real_pools.install, os.environ, api_key=KEYS["user"]),
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), BENCH_TIMEOUT_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    report = readable(out.decode(errors="replace"))
    (ARTIFACTS / "bench-serve.txt").write_text(report + "\n")
    print(report, file=sys.stderr)
    assert proc.returncode == 0, report[-3000:]
    result = json.loads((ARTIFACTS / RESULT).read_text())
    assert (result["completed"], result["failed"]) == (PROMPTS, 0)
    assert result["total_output_tokens"] == PROMPTS * 32
    # Streamed completions are chat-class: all of them ran on the interactive server.
    landed = await finished_since(real_pools.servers, before, PROMPTS)
    assert landed["batch"] == 0
    assert landed["interactive"] >= PROMPTS
