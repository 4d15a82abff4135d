"""The worked example's profiles and workload: config A, config B, and the traffic that measures them.

Two pools of simulated Llama-3-8B engines. `interactive` serves chat, agent, RAG and slow streams
up to 2,048 prompt and 512 output tokens at 8 in flight; `bulk` serves long-context and batch
work up to 4,096 prompt and 128 output tokens at 4 in flight. Config A runs `interactive` on
TP=1 with an 8,192-token context and 8 sequences; config B changes only that pool, to TP=2 and
a 16,384-token context. The workload sends each measured lane requests at its largest admitted
shape, so the measured slice reaches the lane's limits instead of falling just short of them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from router.config.models import RequestClass

MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"
# The simulator has no weights to pin: its revision is the content hash of a manifest that says
# so, immutable as a revision must be, rather than a real model's commit it does not serve.
SIMULATOR_MANIFEST = b"lane-router simulator: no weights\n"
MODEL_REVISION = "sha256:" + hashlib.sha256(SIMULATOR_MANIFEST).hexdigest()
INTERACTIVE = "interactive"
BULK = "bulk"
INTERACTIVE_LANES = (RequestClass.CHAT, RequestClass.AGENT, RequestClass.RAG, RequestClass.SLOW_STREAM)
BULK_LANES = (RequestClass.LONG_CONTEXT, RequestClass.BATCH)


@dataclass(frozen=True, slots=True)
class LaneLimits:
    prompt_tokens: int
    output_tokens: int
    in_flight: int


INTERACTIVE_LIMITS = LaneLimits(prompt_tokens=2048, output_tokens=512, in_flight=8)
BULK_LIMITS = LaneLimits(prompt_tokens=4096, output_tokens=128, in_flight=4)


def interactive_settings(config: str) -> dict[str, Any]:
    """The `interactive` pool's capacity settings under config "A" or "B"."""
    a = {"tensor_parallel_size": 1, "max_model_len": 8192, "max_num_seqs": 8, "max_num_batched_tokens": 2048}
    if config == "A":
        return a
    if config == "B":
        return {**a, "tensor_parallel_size": 2, "max_model_len": 16384}
    raise ValueError(f"unknown config {config!r} (A or B)")


def example_profile(
    config: str, *, ports: Mapping[str, int], key_sha256: str, hardware: str
) -> dict[str, Any]:
    """Config A or B as a profile mapping, backends on the given loopback ports."""
    # Four tokens per streamed chunk: the engines, the router and the client all run on the one
    # machine's CPU, and a quarter of the chunks keeps them in real time on a small, shared one.
    identity = {"model_revision": MODEL_REVISION, "hardware_profile": hardware, "stream_interval": 4}
    pools = {
        INTERACTIVE: _pool(ports[INTERACTIVE], {**identity, **interactive_settings(config)}),
        BULK: _pool(
            ports[BULK],
            {**identity, "max_model_len": 16384, "max_num_batched_tokens": 8192, "max_num_seqs": 16},
        ),
    }
    lanes = {cls.value: _lane(INTERACTIVE, INTERACTIVE_LIMITS) for cls in INTERACTIVE_LANES}
    lanes |= {cls.value: _lane(BULK, BULK_LIMITS) for cls in BULK_LANES}
    return {
        "profile": f"evidence-example-{config.lower()}",
        "description": f"config {config} of the capacity-evidence worked example (docs/evidence.md)",
        # Each answer names its lane, so the benchmark can file one record per lane.
        "debug_headers": True,
        # The engines are simulated: the router counts prompt tokens as they do.
        "tokenizer": "simulator",
        "health": {"interval_s": 0.5, "timeout_s": 2.0},
        "pools": pools,
        "lanes": lanes,
        # Prompts from the bulk lanes' limit on are long-context work.
        "classify": {"long_context_tokens": BULK_LIMITS.prompt_tokens},
        "keys": [{"name": "bench", "sha256": key_sha256}],
    }


def example_workload() -> dict[str, Any]:
    """Chat at the interactive lanes' largest shape, long-context prompts at the bulk lanes'."""
    return {
        "name": "evidence-example",
        "description": "each measured lane at its largest admitted request shape",
        "seed": 26,
        "classes": {
            RequestClass.CHAT.value: _shape(0.55, INTERACTIVE_LIMITS),
            RequestClass.LONG_CONTEXT.value: _shape(0.45, BULK_LIMITS),
        },
    }


def _pool(port: int, vllm: Mapping[str, Any]) -> dict[str, Any]:
    return {"backends": [f"http://127.0.0.1:{port}"], "model": MODEL, "vllm": dict(vllm)}


def _lane(pool: str, limits: LaneLimits) -> dict[str, Any]:
    return {
        "pool": pool,
        "max_in_flight": limits.in_flight,
        "max_prompt_tokens": limits.prompt_tokens,
        "max_output_tokens": limits.output_tokens,
    }


def _shape(share: float, limits: LaneLimits) -> dict[str, Any]:
    return {
        "share": share,
        "prompt_tokens": {"dist": "fixed", "value": limits.prompt_tokens},
        "output_tokens": {"dist": "fixed", "value": limits.output_tokens},
    }
