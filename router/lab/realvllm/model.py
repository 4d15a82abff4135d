"""Build a small random-weight Llama and its tokenizer, entirely locally and reproducibly.

No model hub is reachable where the real-vLLM tests run, so the model vLLM serves is made here:
a byte-level BPE tokenizer trained on seeded generated text, a ChatML chat template so
``/v1/chat/completions`` works, and a ``LlamaForCausalLM`` with seeded random weights stored as
bf16 safetensors. Two builds with the same size produce byte-identical directories.

Runs with the vLLM venv's interpreter (it has torch, transformers and tokenizers) and imports
nothing from the router's runtime dependencies::

    PYTHONPATH=. $VENV/bin/python -m router.lab.realvllm.model --out DIR --size tiny|medium
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SEED = 20261129
VOCAB_SIZE = 2048
MAX_POSITIONS = 4096
# Written last: its presence means the directory is complete.
MARKER = ".lane-router-model"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class ModelSize:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int = VOCAB_SIZE
    seed: int = SEED


SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(hidden=128, layers=2, heads=4, intermediate=256),
    "medium": ModelSize(hidden=512, layers=8, heads=8, intermediate=1408),
    # A second, unrelated model to serve beside `tiny`: its own seed, so its own tokenizer and
    # weights, and its own vocabulary and shape (heads stay 32 wide, as vLLM's CPU attention wants).
    "tiny-b": ModelSize(hidden=192, layers=3, heads=6, intermediate=384, vocab=3072, seed=20261207),
}


ONSETS = ("", *"bcdfghklmnprstvw", "st", "tr", "pl", "ch", "sh", "th", "qu")
VOWELS = (*"aeiou", "ea", "ou", "ai", "io")
CODAS = ("", "", *"nrstl", "nd", "st", "ng", "ck", "rt")


def pseudo_word(rng: random.Random) -> str:
    syllables = rng.randint(1, 3)
    return "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(syllables))


def corpus(seed: int, lines: int = 40_000) -> Iterator[str]:
    """Seeded text with a Zipf-like word distribution, numbers, punctuation and code-ish lines.

    Its only job is to give the BPE trainer enough varied byte sequences to learn ~1,800 merges,
    so token counts of ordinary prompts look like those of a real tokenizer.
    """
    rng = random.Random(seed)
    words = sorted({pseudo_word(rng) for _ in range(6000)})
    rng.shuffle(words)
    # Cumulative once: passing plain weights would re-accumulate 6,000 floats per line.
    cum_weights = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(words))))
    punct = [".", ",", "?", "!", ";", ":"]
    for _ in range(lines):
        kind = rng.random()
        if kind < 0.08:
            name = rng.choice(words[:300])
            yield f"def {name}(x, y={rng.randint(0, 99)}):\n    return x * {rng.randint(1, 9)} + y"
        elif kind < 0.14:
            yield json.dumps({rng.choice(words[:200]): rng.randint(0, 10_000), "id": rng.randint(0, 999)})
        else:
            picked = rng.choices(words, cum_weights=cum_weights, k=rng.randint(4, 24))
            text = " ".join(picked)
            yield text[0].upper() + text[1:] + rng.choice(punct)


def train_tokenizer(seed: int, vocab: int = VOCAB_SIZE) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    if tok.get_vocab_size() > vocab:
        raise RuntimeError(f"tokenizer vocab {tok.get_vocab_size()} exceeds {vocab}")
    return tok


def wrap_tokenizer(tok: Any) -> Any:
    from transformers import PreTrainedTokenizerFast  # type: ignore[import-not-found, unused-ignore]

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )


def build_model(size: ModelSize, seed: int, token_ids: dict[str, int]) -> Any:
    # Only the vLLM venv has these; the router's own environment never imports this function.
    import torch  # type: ignore[import-not-found, unused-ignore]
    from transformers import LlamaConfig, LlamaForCausalLM  # type: ignore[import-not-found, unused-ignore]

    config = LlamaConfig(
        vocab_size=size.vocab,
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.heads,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=token_ids["<|endoftext|>"],
        eos_token_id=token_ids["<|im_end|>"],
        pad_token_id=token_ids["<|endoftext|>"],
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    return model.to(torch.bfloat16).eval()


def digest(directory: Path) -> dict[str, str]:
    """sha256 of every file in a built model directory (the marker excluded)."""
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.iterdir())
        if path.is_file() and path.name != MARKER
    }


def build(out: Path, size_name: str, seed: int | None = None) -> dict[str, str]:
    """Build into a temporary sibling directory, then move it into place, so `out` is never half-built.
    `seed` defaults to the size's own."""
    size = SIZES[size_name]
    seed = size.seed if seed is None else seed
    with building(out) as tmp:
        tok = train_tokenizer(seed, size.vocab)
        fast = wrap_tokenizer(tok)
        model = build_model(size, seed, {t: tok.token_to_id(t) for t in SPECIAL_TOKENS})
        model.save_pretrained(tmp, safe_serialization=True)
        fast.save_pretrained(tmp)
        if not (tmp / "tokenizer.json").is_file():
            raise RuntimeError("tokenizer.json was not written")
        return seal(tmp, {"size": size_name, "seed": seed})


@contextlib.contextmanager
def building(out: Path) -> Iterator[Path]:
    """A temporary sibling of `out` to build in, moved into place whole when the block ends
    without an error (so `out` is never half-built), else removed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        yield tmp
        tmp.chmod(0o755)  # mkdtemp makes it private; what is built here is meant to be shared
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def seal(directory: Path, manifest: dict[str, Any]) -> dict[str, str]:
    """Write the marker, last: the manifest with every file's digest. Returns the digests."""
    files = digest(directory)
    text = json.dumps({**manifest, "files": files}, indent=2, sort_keys=True) + "\n"
    (directory / MARKER).write_text(text)
    return files


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m router.lab.realvllm.model", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="directory to create")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--seed", type=int, default=None, help="default: the size's own seed")
    args = parser.parse_args(argv)
    started = time.monotonic()
    files = build(args.out, args.size, args.seed)
    combined = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    print(f"built {args.size} model in {args.out} in {time.monotonic() - started:.1f}s")
    print(f"digest {combined}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
