"""The rendered command lines, read by the real vLLM's own argument parser: every flag exists, and
each means what the pool's `vllm:` block says."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from router.deploy.plan import plan_pools
from router.deploy.render_vllm import ServeCommand, serve_plan
from router.lab.realvllm.install import VllmInstall, VllmSetupMissing, locate
from tests.deploy.samples import cfg, example, small

pytestmark = pytest.mark.vllm

REQUIRE_ENV = "LANE_ROUTER_REQUIRE_VLLM"

# Run inside the vLLM venv: parse each argument list, print the settings it yields (or the error).
_PARSE = """
import contextlib, io, json, sys
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

FIELDS = ("model", "model_tag", "host", "port", "served_model_name", "revision", "max_model_len",
          "max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold", "stream_interval",
          "scheduling_policy", "block_size", "gpu_memory_utilization", "enable_prefix_caching",
          "enable_chunked_prefill", "tensor_parallel_size", "dtype", "kv_cache_dtype")
# Read apart: vLLM's KVEventsConfig, as the engine will build its publisher from it.
KV_FIELDS = ("enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint")
results = []
for argv in json.load(sys.stdin):
    parser = make_arg_parser(FlexibleArgumentParser())
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(argv)
        got = {f: getattr(ns, f, None) for f in FIELDS}
        kv = getattr(ns, "kv_events_config", None)
        if kv is not None:
            got["kv_events_config"] = {f: getattr(kv, f, None) for f in KV_FIELDS}
        results.append(got)
    except SystemExit:
        results.append({"error": err.getvalue().strip().splitlines()[-1]})
print(json.dumps(results))
"""


def _install() -> VllmInstall:
    try:
        return locate(sizes=())
    except VllmSetupMissing as exc:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but the real vLLM environment is missing: {exc}", pytrace=False)
        pytest.skip(f"real vLLM environment not built: {exc}")


def _parse(install: VllmInstall, argvs: list[list[str]]) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env |= {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_CACHE_ROOT": str(install.cache / "vllm")}
    done = subprocess.run(
        [str(install.python), "-c", _PARSE], input=json.dumps(argvs), env=env,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    parsed: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return parsed


def _expected(command: ServeCommand, device: str) -> dict[str, Any]:
    pool = example().pools[command.pool]
    v = pool.vllm
    host, port = command.url.removeprefix("http://").rsplit(":", 1)
    model_key = "model_tag" if device == "gpu" else "model"
    return {
        model_key: pool.model,
        "host": host,
        "port": int(port),
        "served_model_name": [pool.model],
        "revision": v.model_revision,
        "max_model_len": v.max_model_len,
        "max_num_batched_tokens": v.max_num_batched_tokens,
        "max_num_seqs": v.max_num_seqs,
        "long_prefill_token_threshold": v.long_prefill_token_threshold,
        "stream_interval": v.stream_interval,
        "scheduling_policy": v.scheduling_policy,
        "block_size": v.block_size,
        "enable_prefix_caching": v.enable_prefix_caching,
        "enable_chunked_prefill": v.enable_chunked_prefill,
        "tensor_parallel_size": v.tensor_parallel_size,
        "dtype": v.dtype,
        "kv_cache_dtype": v.kv_cache_dtype,
    } | ({"gpu_memory_utilization": v.gpu_memory_utilization} if device == "gpu" else {})


def test_vllm_parses_every_rendered_command_as_the_profile_means_it() -> None:
    install = _install()
    commands = [(d, c) for d in ("gpu", "cpu") for c in serve_plan(example(), d).commands]
    entry = {"gpu": 2, "cpu": 3}  # after `vllm serve` / `python -m <module>`
    removed = ["--model", "m", "--max-num-partial-prefills", "2"]

    parsed = _parse(install, [list(c.argv[entry[d] :]) for d, c in commands] + [removed])

    for (device, command), got in zip(commands, parsed[:-1], strict=True):
        want = _expected(command, device)
        assert {k: got.get(k) for k in want} == want, (device, command.url)
    # The flags the renderer leaves out on vLLM ≥ 0.27 are indeed gone: the check can fail.
    assert "unrecognized arguments: --max-num-partial-prefills" in parsed[-1]["error"]


def test_vllm_reads_a_followed_pools_kv_events_config_as_rendered() -> None:
    install = _install()
    data = small(chat={"kv_events": {"port": 6001, "replay_port": 6101}})
    data["lanes"]["rag"]["balance"] = "precise_prefix"
    data["models"]["org/chat"] = {"tokenizer": "simulator"}
    plans = {p.name: p for p in plan_pools(cfg(data), "cpu")}
    followed, plain = plans["chat"].serve.args, plans["bulk"].serve.args

    got = _parse(install, [["--model", "m", *followed], ["--model", "m", *plain]])

    assert got[0]["enable_prefix_caching"] is True
    assert got[0]["kv_events_config"] == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:6001",
        "replay_endpoint": "tcp://*:6101",
    }
    assert "kv_events_config" not in got[1]
