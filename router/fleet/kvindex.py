"""What one engine holds in its prefix cache, as its KV events tell it: an index of its blocks,
queried with a prompt's token ids for the number of leading tokens the engine has cached.

Pure, no I/O: the subscriber (one per backend) applies decoded batches (router/fleet/kvevents.py).

Keying. The index does not reproduce vLLM's block hash: that depends on the engine's
`--prefix-caching-hash-algo`, on a seed that is random per process for the non-cryptographic
algorithms, on the pickled/CBOR form of Python tuples, and on `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`
truncating it to 64 bits. Each `BlockStored` carries its blocks' token ids, so the router keys every
block with its own chain hash — BLAKE2b of the parent's key and the block's tokens — and
keeps vLLM's hash only to map `BlockRemoved` (which names vLLM's hashes) back to its own key. A
prompt is keyed once per request (`chain_keys`) and then looked up on every backend. The chain's
root is a secret random per process (the first block's parent), so a client cannot craft token
sequences that collide in the index; router replicas need not agree since each keeps its own
index. (A keyed BLAKE2b costs twice as much per block: its key is set up on every call.)

Only `plain` blocks are indexed (no LoRA, multimodal or salted extra keys, GPU tier, first cache
group): those are what a text prompt's token ids alone address. A block whose parent the index
does not hold (its store was missed) cannot be keyed and is skipped.

Memory: per block one entry in each of two dicts, a 16-byte key and vLLM's hash;
`BYTES_PER_BLOCK` is the measured bound (tests/fleet/test_kvindex.py). `max_blocks` caps an index;
past it the oldest stored blocks are forgotten first (an engine evicts its own, so the cap binds
only when removals were lost).
"""

from __future__ import annotations

import hashlib
import os
from array import array
from collections.abc import Iterable, Sequence
from typing import Final

from router.fleet.kvevents import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, KVEvent

KEY_BYTES: Final = 16
# Measured on CPython 3.11 (tracemalloc, tests/fleet/test_kvindex.py): 144–205 bytes a block with
# vLLM's default int hashes, 173–234 with sha256 bytes, the upper end just after a dict doubles.
BYTES_PER_BLOCK: Final = 240
DEFAULT_MAX_BLOCKS: Final = 1 << 20  # ≈ 240 MiB per backend at worst; a vLLM GPU cache holds far fewer

_ROOT: Final = os.urandom(16)


def chain_keys(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """The router's keys of a prompt's full blocks, in order; a partial last block has none
    (vLLM caches full blocks only). An id no index holds — outside 4-byte unsigned ints, which
    router/fleet/kvevents.py refuses in a stored block — ends the prompt's keys before its block:
    no engine's index can hold that block or any after it."""
    try:
        raw = array("I", token_ids).tobytes()
    except OverflowError:
        raw = array("I", _keyable_prefix(token_ids)).tobytes()
    step = block_size * 4
    keys: list[bytes] = []
    parent = _ROOT
    for start in range(0, len(raw) - step + 1, step):
        parent = _key(parent, raw[start : start + step])
        keys.append(parent)
    return keys


def _keyable_prefix(token_ids: Sequence[int]) -> Sequence[int]:
    for i, token in enumerate(token_ids):
        if not 0 <= token < 1 << 32:
            return token_ids[:i]
    return token_ids


def _key(parent: bytes, block: bytes) -> bytes:
    return hashlib.blake2b(parent + block, digest_size=KEY_BYTES).digest()


class BlockIndex:
    """One backend's cached blocks. `block_size` is learnt from the first block stored; blocks of
    another size (partial blocks of hybrid models) are skipped."""

    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        self._max = max_blocks
        self._by_hash: dict[BlockHash, bytes] = {}  # vLLM's hash → our key, oldest first
        self._held: dict[bytes, int] = {}  # our key → how many of vLLM's hashes name it
        self.block_size: int | None = None
        self.skipped = 0  # blocks not indexed: not plain, orphaned, or of another size

    def __len__(self) -> int:
        return len(self._by_hash)

    def apply(self, events: Iterable[KVEvent]) -> None:
        for event in events:
            if isinstance(event, BlockStored):
                self._store(event)
            elif isinstance(event, BlockRemoved):
                self._remove(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self.clear()

    def clear(self) -> None:
        self._by_hash.clear()
        self._held.clear()

    def cached_tokens(self, keys: Sequence[bytes]) -> int:
        """How many leading tokens of the prompt keyed `keys` (chain_keys at this index's block
        size) the backend holds: O(blocks of the prompt)."""
        held = self._held
        n = 0
        for key in keys:
            if key not in held:
                break
            n += 1
        return n * (self.block_size or 0)

    def _store(self, event: BlockStored) -> None:
        if self.block_size is None and event.plain:
            self.block_size = event.block_size
        if not event.plain or event.block_size != self.block_size:
            self.skipped += len(event.block_hashes)
            return
        if event.parent_block_hash is None:
            parent = _ROOT
        else:
            found = self._by_hash.get(event.parent_block_hash)
            if found is None:
                self.skipped += len(event.block_hashes)
                return
            parent = found
        raw = array("I", event.token_ids).tobytes()
        step = event.block_size * 4
        for i, vllm_hash in enumerate(event.block_hashes):
            parent = _key(parent, raw[i * step : (i + 1) * step])
            if vllm_hash not in self._by_hash:
                self._add(vllm_hash, parent)

    def _add(self, vllm_hash: BlockHash, key: bytes) -> None:
        self._by_hash[vllm_hash] = key
        self._held[key] = self._held.get(key, 0) + 1
        if len(self._by_hash) > self._max:
            oldest = next(iter(self._by_hash))
            self._remove((oldest,))

    def _remove(self, hashes: Iterable[BlockHash]) -> None:
        for vllm_hash in hashes:
            key = self._by_hash.pop(vllm_hash, None)
            if key is None:
                continue
            left = self._held[key] - 1
            if left:
                self._held[key] = left
            else:
                del self._held[key]
