"""The real-vLLM test profile: two pools, each backed by one real server started from the pool's
own `vllm:` block (rendered by `router.config.render.pool_serve_args`, as a deployment would be).

- `interactive` serves chat-like traffic: 16 sequences at once, scheduled by priority (the router
  sets each request's priority from its lane).
- `batch` is deliberately narrow — one sequence, and vLLM's own queue limit of one request — so a
  single long request saturates it and the next one is answered 503 (the retry test needs that).

Both run float32: on hosts without AVX-512, bf16 matmuls fall back to slow paths. The block size
is vLLM's CPU default (128); the renderer's generic default (16) makes the CPU backend warn that
it is not optimised. Each server accepts its own pool key plus a shared key, so a test pool may
put both servers behind one upstream key.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from router.lab.realvllm.install import VLLM_VERSION
from tests.support.profiles import profile

MODEL_NAME = "tiny"
POOL_NAMES = ("interactive", "batch")
POOL_KEYS = {"interactive": "pool-a-key", "batch": "pool-b-key"}
SHARED_KEY = "pool-shared-key"
MAX_MODEL_LEN = 2048

_COMMON: dict[str, Any] = {
    "version": VLLM_VERSION,
    "max_model_len": MAX_MODEL_LEN,
    "max_num_batched_tokens": 2048,
    "dtype": "float32",
    "block_size": 128,
}
POOL_VLLM: dict[str, dict[str, Any]] = {
    "interactive": {**_COMMON, "max_num_seqs": 16, "scheduling_policy": "priority"},
    "batch": {**_COMMON, "max_num_seqs": 1, "max_num_queued_reqs": 1},
}


def real_profile(urls: Mapping[str, str], tokenizer: Path, **top: Any) -> dict[str, Any]:
    """The router profile in front of the real servers: `urls` maps pool name → server URL."""
    data = profile([urls["interactive"]], [urls["batch"]], tokenizer=str(tokenizer))
    data["health"] = {"interval_s": 0.5, "timeout_s": 2.0, "unhealthy_after": 3, "healthy_after": 1}
    for name, pool in data["pools"].items():
        pool.update(
            model=MODEL_NAME,
            upstream_api_key=POOL_KEYS[name],
            connect_timeout_s=10.0,
            # A non-streamed answer's head comes only once vLLM generated all of it, which on a
            # busy CPU host can take far longer than a fake backend's 5 s allowance.
            response_head_timeout_s=120.0,
            read_timeout_s=60.0,
            vllm=dict(POOL_VLLM[name]),
        )
    data.update(top)
    return data
