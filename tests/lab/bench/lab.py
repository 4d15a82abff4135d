"""A small lab for tests: a quick six-class workload and two-pool profiles for the tiny CPU model."""

from __future__ import annotations

from typing import Any

from router.keys.auth import hash_key
from router.lab.bench.workload import WorkloadSpec

KEY = "lab-test-key-0123456789"
MODEL = "tiny-llama"


def quick_workload(seed: int = 5) -> WorkloadSpec:
    """Six classes with short answers, so a few seconds of arrivals finish in a few more."""
    fixed_slo: dict[str, Any] = {"ttft_s": 5.0}
    return WorkloadSpec.model_validate(
        {
            "name": "quick-six",
            "seed": seed,
            "classes": {
                "chat": {
                    "share": 0.3,
                    "prompt_tokens": {"min": 40, "max": 200},
                    "output_tokens": {"min": 5, "max": 15},
                    "slo": fixed_slo,
                },
                "rag": {
                    "share": 0.2,
                    "documents": {"count": 2, "tokens": 300, "zipf": 1.1},
                    "question_tokens": {"min": 10, "max": 20},
                    "output_tokens": {"min": 5, "max": 10},
                    "slo": fixed_slo,
                },
                "long_context": {
                    "share": 0.1,
                    "prompt_tokens": {"min": 1100, "max": 1300},
                    "output_tokens": {"dist": "fixed", "value": 5},
                    "slo": fixed_slo,
                },
                "agent": {
                    "share": 0.2,
                    "stream": False,
                    "output_tokens": {"min": 3, "max": 8},
                    "session": {
                        "steps": {"min": 2, "max": 3},
                        "initial_tokens": {"dist": "fixed", "value": 100},
                        "step_tokens": {"min": 20, "max": 50},
                        "think_s": {"min": 0.05, "max": 0.1},
                    },
                    "slo": {"e2e_s": 5.0},
                },
                "batch": {
                    "share": 0.1,
                    "stream": False,
                    "prompt_tokens": {"min": 100, "max": 300},
                    "output_tokens": {"min": 260, "max": 280},
                    "slo": {"e2e_s": 10.0},
                },
                "slow_stream": {
                    "share": 0.1,
                    "prompt_tokens": {"min": 40, "max": 200},
                    "output_tokens": {"min": 10, "max": 20},
                    "slow_readers": {"clients": 3, "tokens_per_s": {"min": 20, "max": 40}},
                    "slo": fixed_slo,
                },
            },
        }
    )


def two_pools(
    interactive: list[str], bulk: list[str], name: str = "two-pools", **lanes: Any
) -> dict[str, Any]:
    vllm = {"max_model_len": 2048, "max_num_batched_tokens": 2048, "max_num_seqs": 64}
    data: dict[str, Any] = {
        "profile": name,
        "debug_headers": True,
        "tokenizer": "simulator",  # the engines are simulated: count prompts as they do
        "health": {"interval_s": 0.2, "timeout_s": 1.0},
        "pools": {
            "interactive": {"backends": interactive, "model": MODEL, "vllm": vllm},
            "bulk": {"backends": bulk, "model": MODEL, "vllm": vllm},
        },
        "lanes": {
            "chat": {"pool": "interactive"},
            "rag": {"pool": "interactive", "balance": "prefix_affinity"},
            "agent": {"pool": "interactive"},
            "slow_stream": {"pool": "interactive"},
            "long_context": {"pool": "bulk"},
            "batch": {"pool": "bulk"},
        },
        "classify": {
            "long_context_tokens": 1000,
            "batch_min_output_tokens": 256,
            "repeated_prefix": {"min_tokens": 64, "seen": 2, "window_s": 60},
        },
        "keys": [{"name": "lab", "sha256": hash_key(KEY)}],
    }
    data["lanes"].update(lanes)
    return data


def one_pool(backends: list[str], name: str = "one-pool") -> dict[str, Any]:
    data = two_pools(backends, backends, name)
    data["pools"] = {"shared": data["pools"]["interactive"]}
    data["lanes"] = {cls: {"pool": "shared"} for cls in data["lanes"]}
    return data
