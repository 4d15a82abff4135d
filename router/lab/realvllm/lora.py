"""Build a LoRA adapter of a locally built model, without any download and without peft.

vLLM loads a PEFT-format directory: `adapter_config.json` and `adapter_model.safetensors` holding,
for every decoder layer and target projection, `lora_A` ([rank, in]) and `lora_B` ([out, rank]).
Both matrices are seeded random and non-zero (PEFT starts `lora_B` at zero, which would make the
adapter answer exactly as its base model), so an adapter's answers differ from its base's.

Runs with the vLLM venv's interpreter (torch and safetensors)::

    PYTHONPATH=. $VENV/bin/python -m router.lab.realvllm.lora --base DIR --out DIR [--seed N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from router.lab.realvllm.model import building, seal

RANK = 8
ALPHA = 16
TARGETS = ("q_proj", "v_proj")
SEED = 20261207


def adapter_config(base_name: str) -> dict[str, Any]:
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_name,
        "r": RANK,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(TARGETS),
        "fan_in_fan_out": False,
        "modules_to_save": None,
    }


def projection_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) features of each target projection, from the base model's config.json."""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    return {"q_proj": (hidden, heads * head_dim), "v_proj": (hidden, kv_heads * head_dim)}


def tensor_names(layers: int) -> list[tuple[str, str, str]]:
    """(projection, A name, B name) for every layer, as PEFT names them."""
    out = []
    for layer in range(layers):
        for proj in TARGETS:
            stem = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            out.append((proj, f"{stem}.lora_A.weight", f"{stem}.lora_B.weight"))
    return out


def weights(config: dict[str, Any], seed: int) -> dict[str, Any]:
    # Only the vLLM venv has torch; the router's own environment never calls this function.
    import torch  # type: ignore[import-not-found, unused-ignore]

    shapes = projection_shapes(config)
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, Any] = {}
    for proj, a_name, b_name in tensor_names(int(config["num_hidden_layers"])):
        fan_in, fan_out = shapes[proj]
        # Scaled so the update (alpha / rank) · B·A is of the order of the base's own weights.
        tensors[a_name] = (torch.randn(RANK, fan_in, generator=gen) / fan_in**0.5).to(torch.bfloat16)
        tensors[b_name] = (torch.randn(fan_out, RANK, generator=gen) * 0.05).to(torch.bfloat16)
    return tensors


def build(base: Path, out: Path, seed: int = SEED) -> dict[str, str]:
    """Build into a temporary sibling directory, then move it into place (never half-built)."""
    from safetensors.torch import save_file  # type: ignore[import-not-found, unused-ignore]

    config = json.loads((base / "config.json").read_text())
    with building(out) as tmp:
        save_file(weights(config, seed), str(tmp / "adapter_model.safetensors"))
        text = json.dumps(adapter_config(base.name), indent=2, sort_keys=True) + "\n"
        (tmp / "adapter_config.json").write_text(text)
        return seal(tmp, {"kind": "lora", "base": base.name, "seed": seed})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m router.lab.realvllm.lora", description=__doc__)
    parser.add_argument("--base", type=Path, required=True, help="the built base model's directory")
    parser.add_argument("--out", type=Path, required=True, help="directory to create")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    started = time.monotonic()
    build(args.base, args.out, args.seed)
    print(f"built LoRA adapter of {args.base.name} in {args.out} in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
