"""vLLM's KV cache events as they arrive from an engine's ZMQ publisher, decoded into typed events.

Pure: one multipart message in, one batch out, or None when the message is not one vLLM writes.
Nothing here raises into the subscriber's loop; an engine (or anything that reaches its port)
cannot stop the stream with a malformed frame.

The wire, as vLLM 0.32 writes it (vllm/distributed/kv_events.py): three frames `(topic, seq, payload)`,
`seq` an 8-byte big-endian counter the publisher starts at 0, `payload` msgpack of the batch as an
array `[ts, events]` or `[ts, events, data_parallel_rank]`. Each event is a map tagged by
`"type"`: `BlockStored` (`block_hashes`, `parent_block_hash`, `token_ids`, `block_size`,
`lora_id`, `medium`, `lora_name`, and, when set, `extra_keys`, `group_idx`, …), `BlockRemoved`
(`block_hashes`, `medium`, …), `AllBlocksCleared`. A block hash is an int (64 bits, vLLM's
default) or bytes (sha256), as the engine is configured. The replay socket answers with the same
three frames and ends with an empty topic, seq -1 and an empty payload.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, NamedTuple, TypeGuard

import msgpack

BlockHash = int | bytes

# The replay socket's end marker: seq -1 as 8 signed big-endian bytes.
END_SEQ: Final = (-1).to_bytes(8, "big", signed=True)
# A payload larger than this is refused unread; vLLM's batches hold one scheduler step's events, a
# few MiB at the most.
MAX_PAYLOAD: Final = 16 * 1024 * 1024
# The most items of one array: token ids of one step's stored blocks (2M tokens). msgpack refuses
# a longer array, or a longer map, string or binary, from its header, before building anything.
MAX_ITEMS: Final = 1 << 21
_MAX_MAP: Final = 256  # an event's fields
_MAX_BYTES: Final = 1 << 20  # a string or a sha256 hash
# Token ids up to 64 bits are accepted; the index keys ids below 2^32 (router/fleet/kvindex.py), as
# every real vocabulary's are: a block holding a larger id is not indexed.
_MAX_TOKEN: Final = 2**64


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockStored:
    """Blocks an engine cached, in chain order: `token_ids` holds `block_size` tokens per hash.
    `plain`: no LoRA, no extra keys but a cache salt, and the GPU tier of the first KV cache group
    — the blocks a text prompt's tokens (and its salt) alone address. `salt`: the cache salt a
    chain's first block carries as its only extra key (vLLM salts a prompt's first block only)."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    plain: bool
    salt: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]
    plain: bool


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    seq: int
    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None


class Malformed(ValueError):
    """A message that is not one vLLM's publisher writes."""


def decode_message(frames: Sequence[bytes]) -> EventBatch | None:
    """One message of the PUB stream or of a replay answer; None for a malformed message (the
    caller counts it and drops it). The replay's end marker is not a batch: see `is_end_marker`."""
    try:
        return _decode(frames)
    except Malformed:
        return None


def is_end_marker(frames: Sequence[bytes]) -> bool:
    return len(frames) == 3 and frames[1] == END_SEQ and not frames[2]


def _decode(frames: Sequence[bytes]) -> EventBatch:
    if len(frames) != 3:
        raise Malformed("not three frames")
    _topic, seq_bytes, payload = frames
    if len(seq_bytes) != 8:
        raise Malformed("sequence is not 8 bytes")
    if len(payload) > MAX_PAYLOAD:
        raise Malformed("payload too large")
    seq = int.from_bytes(seq_bytes, "big")
    try:
        body: Any = msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=False,
            max_array_len=MAX_ITEMS,
            max_map_len=_MAX_MAP,
            max_str_len=_MAX_BYTES,
            max_bin_len=_MAX_BYTES,
            max_ext_len=0,  # vLLM writes no extension types
        )
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise Malformed("not msgpack") from exc
    if not isinstance(body, list) or len(body) not in (2, 3):
        raise Malformed("batch is not [ts, events(, rank)]")
    ts, events = body[0], body[1]
    rank = body[2] if len(body) == 3 else None
    if not _is_number(ts) or not isinstance(events, list):
        raise Malformed("bad ts or events")
    if rank is not None and not _is_int(rank):
        raise Malformed("bad data_parallel_rank")
    return EventBatch(seq, float(ts), tuple(_event(e) for e in events), rank)


def _event(raw: Any) -> KVEvent:
    if not isinstance(raw, dict):
        raise Malformed("event is not a map")
    kind = raw.get("type")
    if kind == "BlockStored":
        return _stored(raw)
    if kind == "BlockRemoved":
        return BlockRemoved(_hashes(raw.get("block_hashes")), _plain(raw))
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    raise Malformed("unknown event type")


def _stored(raw: dict[Any, Any]) -> BlockStored:
    hashes = _hashes(raw.get("block_hashes"))
    parent = raw.get("parent_block_hash")
    if parent is not None and not _is_hash(parent):
        raise Malformed("bad parent_block_hash")
    size = raw.get("block_size")
    tokens = raw.get("token_ids")
    if not _is_int(size) or size <= 0 or not isinstance(tokens, list):
        raise Malformed("bad block_size or token_ids")
    if len(tokens) != size * len(hashes):
        raise Malformed("token_ids do not fill the blocks")
    if not all(_is_int(t) and 0 <= t < _MAX_TOKEN for t in tokens):
        raise Malformed("bad token id")
    plain = _plain(raw) and raw.get("lora_name") is None and raw.get("lora_id") is None
    extra = _extra_keys(raw.get("extra_keys"), parent is None)
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=tuple(tokens),
        block_size=size,
        plain=plain and extra is not False,
        salt=extra if isinstance(extra, str) else None,
    )


def _extra_keys(extra: Any, first: bool) -> str | bool:
    """A stored chain's extra keys (one entry per block, untagged): True for none, the salt when the
    chain's first block carries only a cache salt (a string), False for any other (a LoRA name,
    multimodal (identifier, offset) pairs, prompt embeddings' digests)."""
    if extra is None:
        return True
    if not isinstance(extra, list) or not all(k is None for k in extra[1:]):
        return False
    head = extra[0] if extra else None
    if head is None:
        return True
    if first and isinstance(head, list) and len(head) == 1 and isinstance(head[0], str) and head[0]:
        return head[0]
    return False


def _plain(raw: dict[Any, Any]) -> bool:
    """The GPU tier (or unspecified) of the first KV cache group, published by the engine itself."""
    return (
        raw.get("medium") in (None, "GPU")
        and raw.get("group_idx") in (None, 0)
        and raw.get("locality") in (None, "LOCAL")
    )


def _hashes(raw: Any) -> tuple[BlockHash, ...]:
    if not isinstance(raw, list) or not all(_is_hash(h) for h in raw):
        raise Malformed("bad block_hashes")
    return tuple(raw)


def _is_hash(value: Any) -> bool:
    return isinstance(value, bytes) or _is_int(value)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


class Step(Enum):
    FIRST = "first"  # the first batch seen from this publisher
    NEXT = "next"  # the one expected
    GAP = "gap"  # batches were lost: ask the replay socket for them
    BEHIND = "behind"  # older than expected: a replayed duplicate, or a restarted publisher


class SeqStep(NamedTuple):
    step: Step
    missing_from: int  # for GAP: the first lost sequence number (the replay request's start)
    missing_to: int  # for GAP: one past the last lost one (the batch that revealed the gap)


def sequence_step(last: int | None, seq: int) -> SeqStep:
    """Where batch `seq` stands after `last`, the last batch applied (None: none yet)."""
    if last is None:
        return SeqStep(Step.FIRST, seq, seq)
    if seq == last + 1:
        return SeqStep(Step.NEXT, seq, seq)
    if seq > last + 1:
        return SeqStep(Step.GAP, last + 1, seq)
    return SeqStep(Step.BEHIND, seq, seq)


def replay_request(start: int) -> bytes:
    """What a REQ/DEALER socket sends vLLM's replay ROUTER: the first sequence number wanted."""
    return start.to_bytes(8, "big")
