"""Deterministic text → token ids, consistent with the router's prompt-size heuristic: the
algorithm is router/request/simtokens.py's (the router works out the same ids for a
`precise_prefix` lane); generated text is made of the filler words below.
"""

from __future__ import annotations

from collections.abc import Iterable

from router.request.simtokens import chat_token_ids, chunk_id, text_token_ids

__all__ = [
    "FILLER_IDS",
    "FILLER_STRIDE",
    "FILLER_WORDS",
    "chat_token_ids",
    "detokenize",
    "filler_token",
    "text_token_ids",
]

# Generated text is made of these 4-character words, so re-tokenizing an answer that starts on a
# chunk boundary yields the same ids and the same count.
FILLER_WORDS: tuple[str, ...] = (
    " the",
    " and",
    " for",
    " you",
    " not",
    " are",
    " was",
    " but",
    " all",
    " can",
    " her",
    " one",
    " out",
    " day",
    " get",
    " has",
    " him",
    " his",
    " how",
    " man",
    " new",
    " now",
    " old",
    " see",
    " two",
    " way",
    " who",
    " did",
    " its",
    " let",
    " put",
    " say",
)


FILLER_IDS: tuple[int, ...] = tuple(chunk_id(w) for w in FILLER_WORDS)


FILLER_STRIDE = 7


def filler_token(seed: int, position: int) -> int:
    """Index into FILLER_WORDS/FILLER_IDS of output token `position` of a request seeded `seed`."""
    return (seed + position * FILLER_STRIDE) % len(FILLER_WORDS)


def detokenize(ids: Iterable[int]) -> str:
    """Text of token ids: filler ids map back to their words; an id that is only a hash is shown
    as ``<|id|>`` since a hash cannot be inverted."""
    words = dict(zip(FILLER_IDS, FILLER_WORDS, strict=True))
    return "".join(words.get(i, f"<|{i}|>") for i in ids)
