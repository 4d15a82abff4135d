"""`lane-router sim`'s token ids of a text and of a chat prompt: what its engines compute from a
request, and so what the router passes a `precise_prefix` lane for a model counted by the
simulator's rule (router/request/promptids.py).

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
from collections.abc import Mapping, Sequence
from typing import Any, Final

from router.request.tokens import CHARS_PER_TOKEN, estimate_text_tokens, message_text

_SALT_MASK: Final = (1 << 30) - 1

_NATIVE_UINT32_LE: Final = array("I").itemsize == 4 and sys.byteorder == "little"


def chunk_id(chunk: str) -> int:
    """The id of one chunk of at most 4 characters."""
    raw = chunk.encode("utf-8", "surrogatepass")
    if len(raw) == CHARS_PER_TOKEN:
        return int.from_bytes(raw, "little")
    return zlib.crc32(raw) | 1 << 32  # outside the 4-byte range: never equal to a plain chunk


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
        ids = [chunk_id(text[i : i + step]) for i in range(0, body_chars, step)]
    ids.append(chunk_id(text[body_chars:]))
    if salt:
        # Above a chunk's 33 bits yet below 63: an id stays a JSON integer every reader takes.
        ids[0] ^= (salt & _SALT_MASK) << 33
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


def completion_token_ids(prompt: object) -> list[int] | None:
    """Token ids of a completions `prompt`: a string, a list of token ids, or a list of one of
    those; None for anything else (the simulator refuses it)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return text_token_ids(prompt)
    if isinstance(prompt, list) and prompt and all(_is_id(t) for t in prompt):
        return list(prompt)
    return None


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
