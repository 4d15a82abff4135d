"""The KV cache events a vLLM engine publishes, as the simulator's block manager produces them.

A block is *stored* when it becomes a cached full block (it enters the prefix-cache index),
*removed* when it is evicted from that index, and a prefix-cache reset clears everything. Events
name blocks by vLLM's own hash: SHA-256 over the pickled ``(parent digest, token ids, extra
keys)``, chained from the digest of the seed ``"vllm-none-hash"`` (vLLM's default
``sha256`` algorithm without PYTHONHASHSEED), published as the digest's low 64 bits (vLLM's
default external form). A consumer that hashes a prompt's tokens the way vLLM does therefore finds
the same hashes on the simulator as on a real engine.

On the wire a batch is msgpack: ``[ts, [event, ...], data_parallel_rank]``, each event a map
whose first key ``type`` names it, then its fields in vLLM's order, fields equal to their default
left out (msgspec's ``array_like`` batch and ``tag=True, omit_defaults=True`` events).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

MEDIUM_GPU = "GPU"
_NONE_HASH_SEED = "vllm-none-hash"
_EXTERNAL_MASK = (1 << 64) - 1


def _sha256_pickle(value: object) -> bytes:
    # Only dumps: the bytes are hashed, never loaded.
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


NONE_HASH = _sha256_pickle(_NONE_HASH_SEED)


def block_digest(parent: bytes | None, token_ids: Sequence[int], salt: str | None = None) -> bytes:
    """vLLM's hash of one full block: chained to the parent block's digest (the seed for the
    first block), over the block's token ids and its extra keys: a prompt's cache salt, tagged,
    on its first block only; none otherwise."""
    extra = (("cache_salt", salt),) if salt else None
    return _sha256_pickle((parent or NONE_HASH, tuple(token_ids), extra))


def external_hash(digest: bytes) -> int:
    """The form vLLM publishes a block hash in: the digest's low 64 bits, unsigned."""
    return int.from_bytes(digest, "big") & _EXTERNAL_MASK


@dataclass(slots=True)
class BlockStored:
    digests: list[bytes]
    parent: bytes | None
    token_ids: list[int]
    block_size: int
    salts: list[str | None] = field(default_factory=list)  # each block's cache salt, if any


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    digest: bytes


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventLog:
    """Events of one engine step, in the order the block manager caused them. Blocks stored one
    after another along one chain share one BlockStored event, as vLLM reports the blocks a
    request fills in a step."""

    __slots__ = ("_events",)

    def __init__(self) -> None:
        self._events: list[KVEvent] = []

    def stored(
        self,
        digest: bytes,
        parent: bytes | None,
        token_ids: Sequence[int],
        block_size: int,
        salt: str | None = None,
    ) -> None:
        last = self._events[-1] if self._events else None
        if isinstance(last, BlockStored) and parent is not None and last.digests[-1] == parent:
            last.digests.append(digest)
            last.token_ids.extend(token_ids)
            last.salts.append(salt)
            return
        self._events.append(
            BlockStored(
                digests=[digest],
                parent=parent,
                token_ids=list(token_ids),
                block_size=block_size,
                salts=[salt],
            )
        )

    def removed(self, digest: bytes) -> None:
        self._events.append(BlockRemoved(digest))

    def cleared(self) -> None:
        self._events.append(AllBlocksCleared())

    def take(self) -> list[KVEvent]:
        """The events so far, oldest first; the log starts empty again."""
        events, self._events = self._events, []
        return events


def event_wire(event: KVEvent) -> dict[str, Any]:
    """One event as vLLM's encoder lays it out (key order matters for byte equality)."""
    if isinstance(event, BlockStored):
        return {
            "type": "BlockStored",
            "block_hashes": [external_hash(d) for d in event.digests],
            "parent_block_hash": None if event.parent is None else external_hash(event.parent),
            "token_ids": event.token_ids,
            "block_size": event.block_size,
            "lora_id": None,
            "medium": MEDIUM_GPU,
            "lora_name": None,
            **_extra_keys(event.salts),
            "group_idx": 0,
        }
    if isinstance(event, BlockRemoved):
        return {
            "type": "BlockRemoved",
            "block_hashes": [external_hash(event.digest)],
            "medium": MEDIUM_GPU,
            "group_idx": 0,
        }
    return {"type": "AllBlocksCleared"}


def _extra_keys(salts: Sequence[str | None]) -> dict[str, Any]:
    """vLLM's per-block extra keys, untagged (a cache salt as its bare string), or no field when
    no block has any."""
    if not any(salts):
        return {}
    return {"extra_keys": [[s] if s else None for s in salts]}


def encode_batch(ts: float, events: Sequence[KVEvent], data_parallel_rank: int = 0) -> bytes:
    """One KVEventBatch payload, byte for byte as vLLM's publisher encodes it."""
    body = [ts, [event_wire(e) for e in events], data_parallel_rank]
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed
