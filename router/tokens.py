"""Prompt-token estimates: a fast character heuristic by default, exact counts from a
`tokenizer.json` when the profile names one."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

# English-like text averages about four characters a token in BPE vocabularies; the simulator
# maps text to token ids with the same ratio so both sides agree on prompt lengths.
CHARS_PER_TOKEN = 4
# Chat templates wrap every message in role markers (e.g. `<|im_start|>user\n … <|im_end|>\n`).
MESSAGE_OVERHEAD_TOKENS = 4


def estimate_text_tokens(text: str) -> int:
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


class TokenCounter(Protocol):
    def count(self, text: str) -> int: ...


class HeuristicCounter:
    def count(self, text: str) -> int:
        return estimate_text_tokens(text)


class TokenizerCounter:
    """Exact counts with the model's own tokenizer (the `tokenizers` package, no model hub)."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(path))

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)


def make_counter(tokenizer_path: str | None) -> TokenCounter:
    return TokenizerCounter(tokenizer_path) if tokenizer_path else HeuristicCounter()
