"""The locally built model: reproducible to the byte, and a tokenizer the router can count with."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from router.lab.realvllm.install import VllmInstall
from router.lab.realvllm.model import MARKER, SPECIAL_TOKENS, VOCAB_SIZE, digest

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
