"""The locally built models and adapters: reproducible to the byte, a tokenizer the router can count
with, a second model unlike the first, adapters shaped for `tiny`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from router.lab.realvllm.install import ADAPTERS, MULTI_MODEL, SECOND_MODEL, VllmInstall
from router.lab.realvllm.lora import RANK
from router.lab.realvllm.model import MARKER, SEED, SIZES, SPECIAL_TOKENS, VOCAB_SIZE, digest
from tests.lab.realvllm.conftest import require_install

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.vllm


def test_rebuild_is_byte_identical(vllm_install: VllmInstall, tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    subprocess.run(
        [str(vllm_install.python), "-m", "router.lab.realvllm.model", "--out", str(out), "--size", "tiny"],
        env=env, check=True, capture_output=True, timeout=110,
    )  # fmt: skip
    installed = json.loads((vllm_install.model("tiny") / MARKER).read_text())
    assert digest(out) == installed["files"] == digest(vllm_install.model("tiny"))
    assert {"model.safetensors", "tokenizer.json", "config.json"} <= set(installed["files"])


def test_tokenizer_json_counts_and_round_trips(vllm_install: VllmInstall) -> None:
    tokenizer = Tokenizer.from_file(str(vllm_install.model("tiny") / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == VOCAB_SIZE
    ids = [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS]
    assert ids == [0, 1, 2]
    text = "Routing 1,000 prompts: naïve ✓ — déjà vu\n\tdef f(x): return {'k': 7}"
    encoded = tokenizer.encode(text)
    assert tokenizer.decode(encoded.ids) == text  # byte-level: nothing is lost
    # Merges were learnt: ordinary text takes clearly fewer tokens than bytes.
    assert len(tokenizer.encode("the quick brown fox ran on").ids) < len("the quick brown fox ran on")
    # Chat markers are single tokens, so a rendered ChatML prompt counts exactly.
    assert tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n").ids[0] == ids[1]


def test_config_matches_the_tiny_shape(vllm_install: VllmInstall) -> None:
    config = json.loads((vllm_install.model("tiny") / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (128, 2, 4)
    assert config["vocab_size"] == VOCAB_SIZE
    assert config["max_position_embeddings"] == 4096
    assert config["eos_token_id"] == 2


def test_the_second_model_is_another_model() -> None:
    install = require_install(MULTI_MODEL)
    first, second = install.model("tiny"), install.model(SECOND_MODEL)
    config = json.loads((second / "config.json").read_text())
    size = SIZES[SECOND_MODEL]
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (
        size.hidden, size.layers, size.vocab,
    )  # fmt: skip
    assert config["hidden_size"] // config["num_attention_heads"] == 32
    tokenizer = Tokenizer.from_file(str(second / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == size.vocab != VOCAB_SIZE
    # Its own tokenizer: the same text falls into other tokens.
    text = "the quick brown fox ran on"
    assert tokenizer.encode(text).ids != Tokenizer.from_file(str(first / "tokenizer.json")).encode(text).ids
    manifest = json.loads((second / MARKER).read_text())
    assert manifest["seed"] == size.seed != SEED


def safetensors_header(path: Path) -> dict[str, Any]:
    """The tensor table of a safetensors file (an 8-byte length, then JSON)."""
    with path.open("rb") as f:
        length = int.from_bytes(f.read(8), "little")
        header: dict[str, Any] = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return header


def test_the_adapters_fit_tiny() -> None:
    install = require_install(MULTI_MODEL)
    base = json.loads((install.model("tiny") / "config.json").read_text())
    hidden, layers = base["hidden_size"], base["num_hidden_layers"]
    for name in ADAPTERS:
        config = json.loads((install.model(name) / "adapter_config.json").read_text())
        assert (config["peft_type"], config["r"], config["target_modules"]) == (
            "LORA",
            RANK,
            ["q_proj", "v_proj"],
        )
        tensors = safetensors_header(install.model(name) / "adapter_model.safetensors")
        assert len(tensors) == layers * 2 * 2
        for proj in ("q_proj", "v_proj"):
            stem = f"base_model.model.model.layers.{layers - 1}.self_attn.{proj}"
            assert tensors[f"{stem}.lora_A.weight"]["shape"] == [RANK, hidden]
            assert tensors[f"{stem}.lora_B.weight"]["shape"] == [hidden, RANK]
            assert tensors[f"{stem}.lora_A.weight"]["dtype"] == "BF16"
    first, second = (json.loads((install.model(n) / MARKER).read_text())["files"] for n in ADAPTERS)
    assert first != second  # two adapters, not one under two names


def test_an_adapter_rebuild_is_byte_identical(tmp_path: Path) -> None:
    install = require_install(MULTI_MODEL)
    out = tmp_path / "adapter"
    installed = json.loads((install.model(ADAPTERS[0]) / MARKER).read_text())
    subprocess.run(
        [str(install.python), "-m", "router.lab.realvllm.lora", "--base", str(install.model("tiny")),
         "--out", str(out), "--seed", str(installed["seed"])],
        env=dict(os.environ, PYTHONPATH=str(REPO)), check=True, capture_output=True, timeout=110,
    )  # fmt: skip
    assert digest(out) == installed["files"] == digest(install.model(ADAPTERS[0]))
