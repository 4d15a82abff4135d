"""Deterministic filler text whose length gives an exact token count under the project's
estimate (4 characters per token, `router.request.tokens.CHARS_PER_TOKEN`).

Prompts are slices of one seeded corpus of pseudo-words. A prompt that must not share a prefix
with any other starts with its own tag, so the router's prefix fingerprints and the engine's
prefix cache both see it as new from the first block on.
"""

from __future__ import annotations

import random

from router.request.tokens import CHARS_PER_TOKEN

_LETTERS = "etaoinshrdlucmfwypvbgk"
CORPUS_CHARS = 1 << 19  # longer than any prompt the workloads ask for (128k tokens)


class TextSource:
    def __init__(self, seed: int, corpus_chars: int = CORPUS_CHARS) -> None:
        rng = random.Random(f"text:{seed}")
        vocabulary = ["".join(rng.choice(_LETTERS) for _ in range(rng.randint(2, 9))) for _ in range(512)]
        words: list[str] = []
        size = 0
        while size < corpus_chars:
            word = rng.choice(vocabulary)
            words.append(word)
            size += len(word) + 1
        self._corpus = " ".join(words)[:corpus_chars]

    @property
    def corpus_chars(self) -> int:
        return len(self._corpus)

    def text(self, tokens: int, offset: int, tag: str = "") -> str:
        """`tokens × 4` characters: `tag` then corpus text from `offset` (wrapping around)."""
        n = tokens * CHARS_PER_TOKEN
        if len(tag) >= n:
            return tag[:n]
        need = n - len(tag)
        start = offset % len(self._corpus)
        out = self._corpus[start : start + need]
        while len(out) < need:
            out += " " + self._corpus[: need - len(out) - 1]
        return tag + out

    def unique(self, tokens: int, rng: random.Random, tag: str) -> str:
        """Text of `tokens` tokens starting with `tag`, at a random place of the corpus."""
        return self.text(tokens, rng.randrange(len(self._corpus)), tag)
