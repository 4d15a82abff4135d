"""Profiles for tests: a valid base to vary, with keys whose plaintext the tests know."""

from __future__ import annotations

import copy
from typing import Any

from router.keys.auth import hash_key

KEYS = {
    "user": "user-key-0123456789",
    "tester": "tester-key-0123456789",
    "ops": "ops-key-0123456789",
    "scraper": "scraper-key-0123456789",
    "chat-only": "chat-only-key-0123456789",
    "nightly": "nightly-key-0123456789",
    "bge-only": "bge-only-key-0123456789",
}
UPSTREAM_KEY = "pool-upstream-secret"
MODEL = "fake-model"


def auth(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[name]}"}


def profile(interactive: list[str], batch: list[str] | None = None, **top: Any) -> dict[str, Any]:
    """Two pools (interactive, batch) serving MODEL; chat/agent/rag/slow on interactive."""
    batch = batch if batch is not None else interactive
    data: dict[str, Any] = {
        "profile": "test",
        "debug_headers": True,
        # The byte bound, which these profiles' thresholds are set by; without it the router
        # asks the backends' /tokenize where the bound decides (tests/proxy/test_exact_counts.py).
        "tokenizer": "utf8-bytes",
        "health": {"interval_s": 0.2, "timeout_s": 0.5, "unhealthy_after": 2, "healthy_after": 1},
        "pools": {
            "interactive": {
                "backends": interactive,
                "model": MODEL,
                "upstream_api_key": UPSTREAM_KEY,
                "connect_timeout_s": 1.0,
                "response_head_timeout_s": 5.0,
                "head_read_timeout_s": 5.0,
                "read_timeout_s": 5.0,
                "vllm": {"max_model_len": 2048, "max_num_batched_tokens": 2048},
            },
        },
        "lanes": {
            "chat": {"pool": "interactive"},
            "rag": {"pool": "interactive", "balance": "prefix_affinity"},
            "long_context": {"pool": "batch"},
            "agent": {"pool": "interactive"},
            "batch": {"pool": "batch"},
            "slow_stream": {"pool": "interactive"},
        },
        "classify": {
            "long_context_tokens": 1000,
            "batch_min_output_tokens": 256,
            "repeated_prefix": {"min_tokens": 64, "seen": 2, "window_s": 60},
        },
        "keys": [
            {"name": "user", "sha256": hash_key(KEYS["user"])},
            {"name": "tester", "sha256": hash_key(KEYS["tester"]), "may_set_class": True},
            {"name": "ops", "sha256": hash_key(KEYS["ops"]), "admin": True},
            {"name": "scraper", "sha256": hash_key(KEYS["scraper"]), "metrics": True},
            {
                "name": "chat-only",
                "sha256": hash_key(KEYS["chat-only"]),
                "classes": ["chat"],
                "models": [MODEL],
            },
            {"name": "nightly", "sha256": hash_key(KEYS["nightly"]), "pin_class": "batch"},
        ],
    }
    if batch == interactive:
        for lane in data["lanes"].values():
            lane["pool"] = "interactive"
    else:
        pool = copy.deepcopy(data["pools"]["interactive"])
        pool["backends"] = batch
        data["pools"]["batch"] = pool
    data.update(top)
    return data


CHAT_MODEL, EMBED_MODEL, RERANK_MODEL = "llama", "bge", "ranker"
INTERACTIVE_CLASSES = ("chat", "rag", "agent", "slow_stream")
BULK_CLASSES = ("long_context", "batch")


def multi_model_profile(
    fast: str, large: str, embed: str, rerank: str | None = None, **top: Any
) -> dict[str, Any]:
    """The test profile's keys and timeouts over several models: CHAT_MODEL on pools `fast`
    (interactive classes; alias `llama-chat`, adapter `sql-lora`) and `large` (the others),
    EMBED_MODEL on `embed`, RERANK_MODEL on `rerank` (when given), each with one backend; keys
    `bge-only` (EMBED_MODEL only) besides the test profile's."""
    data = profile([fast])
    base = data["pools"].pop("interactive")
    data["pools"] = {
        "fast": {**base, "model": CHAT_MODEL, "aliases": ["llama-chat"], "adapters": ["sql-lora"]},
        "large": {**base, "backends": [large], "model": CHAT_MODEL},
        "embed": {**base, "backends": [embed], "model": EMBED_MODEL},
    }
    if rerank is not None:
        data["pools"]["rerank"] = {**base, "backends": [rerank], "model": RERANK_MODEL}
    data["lanes"] = {c: {"pool": "fast"} for c in INTERACTIVE_CLASSES} | {
        c: {"pool": "large"} for c in BULK_CLASSES
    }
    data["keys"] = [k for k in data["keys"] if k["name"] != "chat-only"] + [
        {"name": "bge-only", "sha256": hash_key(KEYS["bge-only"]), "models": [EMBED_MODEL]}
    ]
    data.update(top)
    return data
