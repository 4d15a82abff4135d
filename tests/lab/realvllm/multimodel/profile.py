"""The router profile in front of the two-model servers: one pool per model, the second model's
chat class in a lane of its own (`tiny-b:chat`), the adapter of `tiny` learned from server A's
/v1/models, and a second adapter the router loads on demand from the profile's path.

Its keys: `all` may use every model and route; `tiny-only` and `b-only` are scoped to one model
each (an adapter is a model name of its own in a key's `models:`); `metered` has a `tpm`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from router.config.models import RequestClass
from router.keys.auth import hash_key
from router.lab.realvllm.install import ADAPTERS, SECOND_MODEL, VLLM_VERSION, VllmInstall
from router.lab.realvllm.server import VllmServer

MODEL_A = "tiny"
MODEL_B = SECOND_MODEL
ADAPTER, LAZY_ADAPTER = ADAPTERS  # served from start-up / loaded by the router on demand
SERVER_KEYS = {MODEL_A: "server-a-key", MODEL_B: "server-b-key"}
MAX_MODEL_LEN = 2048
# Between a ~1,500-token English prompt's real length and its UTF-8 byte count.
LONG_CONTEXT_TOKENS = 2000
TPM = 6000
ROUTES = ["chat", "completions", "messages"]
KEYS = {
    "all": "mm-all-key-0123456789",
    "tiny-only": "mm-tiny-only-key-0123456789",
    "b-only": "mm-b-only-key-0123456789",
    "metered": "mm-metered-key-0123456789",
}


def pool_vllm() -> dict[str, Any]:
    """Both pools' `vllm:` block (float32: bf16 matmuls are slow on hosts without AVX-512; the CPU
    block size, 128)."""
    return {
        "version": VLLM_VERSION,
        "max_model_len": MAX_MODEL_LEN,
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 8,
        "dtype": "float32",
        "block_size": 128,
    }


def pool(server: VllmServer, **extra: Any) -> dict[str, Any]:
    return {
        "model": server.served_model_name,
        "backends": [server.url],
        "upstream_api_key": server.api_key,
        "connect_timeout_s": 10.0,
        "response_head_timeout_s": 120.0,
        "read_timeout_s": 60.0,
        "vllm": pool_vllm(),
        **extra,
    }


def keys() -> list[dict[str, Any]]:
    scoped = {"tiny-only": [MODEL_A], "b-only": [MODEL_B]}
    out: list[dict[str, Any]] = []
    for name, plain in KEYS.items():
        key: dict[str, Any] = {"name": name, "sha256": hash_key(plain), "routes": ROUTES}
        if name in scoped:
            key["models"] = scoped[name]
        if name == "metered":
            key["tpm"] = TPM
        out.append(key)
    return out


@dataclass(frozen=True)
class TwoModels:
    """Server A (`tiny`, LoRA on) and server B (`tiny-b`), and how long they took to start."""

    install: VllmInstall
    a: VllmServer
    b: VllmServer
    started_s: float

    def profile(self, **top: Any) -> dict[str, Any]:
        """No `tokenizer:` anywhere: the router counts prompts without a local tokenizer."""
        lazy = {"name": LAZY_ADAPTER, "path": str(self.install.model(LAZY_ADAPTER))}
        data: dict[str, Any] = {
            "profile": "two-models-real",
            "debug_headers": True,
            "health": {"interval_s": 0.5, "timeout_s": 2.0, "unhealthy_after": 3, "healthy_after": 1},
            "pools": {"a": pool(self.a, adapters=[lazy]), "b": pool(self.b)},
            "lanes": {cls.value: {"pool": "a"} for cls in RequestClass},
            "models": {MODEL_B: {"lanes": {"chat": {"pool": "b"}}}},
            "classify": {"long_context_tokens": LONG_CONTEXT_TOKENS, "batch_min_output_tokens": 1024},
            "keys": keys(),
        }
        data.update(top)
        return data
