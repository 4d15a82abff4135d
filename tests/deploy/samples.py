"""Profiles for the deployment tests: the shipped example, and a small one to vary."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from router.config.load import load_profile, parse_profile
from router.config.models import ProfileConfig
from router.keys.auth import hash_key
from tests.deploy.tools import EXAMPLE_PROFILE

# A literal key the renderers accept: `lane-router render` refuses guessable ones (router/keys/hygiene.py).
HASH = hash_key("app-key-of-the-deployment-tests")


def example() -> ProfileConfig:
    return load_profile(EXAMPLE_PROFILE)


def example_data() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(EXAMPLE_PROFILE.read_text(encoding="utf-8"))
    return data


def small(**pools: dict[str, Any]) -> dict[str, Any]:
    """Two pools, `chat` (two backends) and `bulk` (one), each its own model's; keyword arguments
    update a pool's block."""
    data: dict[str, Any] = {
        "profile": "small",
        "pools": {
            "chat": {
                "backends": ["http://10.0.0.1:8101", "http://10.0.0.2:8102"],
                "model": "org/chat",
                "upstream_api_key_env": "CHAT_KEY",
                "vllm": {"version": "0.32.0", "max_model_len": 4096, "max_num_batched_tokens": 1024},
                "admission": {"max_prefilling": 4, "max_long_prefilling": 1},
            },
            "bulk": {
                "backends": ["http://bulk.internal:9000"],
                "model": "org/bulk",
                "upstream_api_key_env": "BULK_KEY",
                "vllm": {"version": "0.32.0", "max_model_len": 16384, "max_num_batched_tokens": 8192},
                "admission": {"max_prefilling": 2, "max_long_prefilling": 1},
            },
        },
        "lanes": {
            "chat": {"pool": "chat"},
            "agent": {"pool": "chat"},
            "rag": {"pool": "chat", "balance": "prefix_affinity"},
            "slow_stream": {"pool": "chat", "decouple": True},
        },
        # The bulk model's own lanes; its other classes, and the chat model's, get default lanes.
        "models": {"org/bulk": {"lanes": {"long_context": {"pool": "bulk"}, "batch": {"pool": "bulk"}}}},
        "keys": [
            {"name": "app", "sha256": HASH},
            {"name": "ops", "sha256_env": "OPS_SHA256", "admin": True},
        ],
    }
    for name, changes in pools.items():
        pool = data["pools"][name]
        for key, value in changes.items():
            if isinstance(value, dict) and isinstance(pool.get(key), dict):
                pool[key] = {**pool[key], **value}
            else:
                pool[key] = value
    return copy.deepcopy(data)


def found_by_dns(**discovery: Any) -> dict[str, Any]:
    """The small profile with its `chat` pool found by DNS (`chat.internal`) instead of listed."""
    data = small()
    del data["pools"]["chat"]["backends"]
    data["pools"]["chat"]["discovery"] = {"dns": "chat.internal", **discovery}
    return data


def cfg(data: dict[str, Any]) -> ProfileConfig:
    return parse_profile(data, "test profile")
