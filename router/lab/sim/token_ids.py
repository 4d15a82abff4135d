"""Deterministic text → token ids, consistent with the router's prompt-size heuristic.

The simulator has no real tokenizer. It cuts text into 4-character chunks and gives each chunk an
id that depends only on its characters (the chunk's 4 bytes when it is ASCII, a CRC-32
otherwise), so that

* the token count of a text is exactly `estimate_text_tokens(text)` — the same "≈4 characters per
  token" estimate of `router.request.tokens`, where it is defined;
* equal text prefixes give equal leading token ids (a chunk's id depends only on its characters),
  which is what makes repeated prefixes hit the prefix cache;
* the result is identical across processes (no use of Python's salted `hash`).

The last token of a text absorbs the 0–3 characters left over, like a real tokenizer whose last
token differs when the text is extended.
"""

from __future__ import annotations

import sys
import zlib
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from router.request.tokens import CHARS_PER_TOKEN, estimate_text_tokens, message_text

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


# Every id fits 32 bits, as a real vocabulary's do: vLLM's KV events carry them and the router's
# index keys them as 4-byte unsigned ints (router/fleet/kvevents.py refuses larger ones).
TOKEN_ID_MASK = (1 << 32) - 1

_NATIVE_UINT32_LE = array("I").itemsize == 4 and sys.byteorder == "little"


def _chunk_id(chunk: str) -> int:
    raw = chunk.encode("utf-8", "surrogatepass")
    if len(raw) == CHARS_PER_TOKEN:
        return int.from_bytes(raw, "little")
    # Within 32 bits, as every id: it may equal an ASCII chunk's id one time in 2^32.
    return zlib.crc32(raw)


def text_token_ids(text: str, *, salt: int = 0) -> list[int]:
    """Token ids of `text`; `len(result) == estimate_text_tokens(text)`. A nonzero `salt`
    changes the first id only, which (through the chained block hashes) changes the identity of
    everything after it, as a role marker would."""
    n = estimate_text_tokens(text)
    step = CHARS_PER_TOKEN
    body_chars = (n - 1) * step
    raw = text[:body_chars].encode("utf-8", "surrogatepass")
    if len(raw) == body_chars:
        # ASCII: every 4-character chunk is 4 bytes, read as one little-endian uint32 each.
        if _NATIVE_UINT32_LE:
            ids = array("I", raw).tolist()
        else:
            ids = [int.from_bytes(raw[i : i + step], "little") for i in range(0, body_chars, step)]
    else:
        ids = [_chunk_id(text[i : i + step]) for i in range(0, body_chars, step)]
    ids.append(_chunk_id(text[body_chars:]))
    if salt:
        ids[0] ^= salt & TOKEN_ID_MASK
    return ids


def _role_salt(role: str) -> int:
    # The role changes the ids (as a chat template's role markers would) but not the count.
    return zlib.crc32(role.encode())


def chat_token_ids(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Token ids of a chat prompt; the count equals `estimate_messages_tokens(messages)`."""
    ids: list[int] = []
    for message in messages:
        ids.extend(text_token_ids(message_text(message), salt=_role_salt(str(message.get("role")))))
    return ids


FILLER_IDS: tuple[int, ...] = tuple(_chunk_id(w) for w in FILLER_WORDS)


FILLER_STRIDE = 7


def filler_token(seed: int, position: int) -> int:
    """Index into FILLER_WORDS/FILLER_IDS of output token `position` of a request seeded `seed`."""
    return (seed + position * FILLER_STRIDE) % len(FILLER_WORDS)


def detokenize(ids: Iterable[int]) -> str:
    """Text of token ids: filler ids map back to their words; an id that is only a hash is shown
    as ``<|id|>`` since a hash cannot be inverted."""
    words = dict(zip(FILLER_IDS, FILLER_WORDS, strict=True))
    return "".join(words.get(i, f"<|{i}|>") for i in ids)
