"""What one engine holds in its prefix cache, as its KV events tell it: an index of its blocks,
queried with a prompt's token ids for the number of leading tokens the engine has cached.

Pure, no I/O: the subscriber (one per backend) applies decoded batches (router/fleet/kvevents.py).

Keying. The index does not reproduce vLLM's block hash: that depends on the engine's
`--prefix-caching-hash-algo`, on a seed that is random per process for the non-cryptographic
algorithms, on the pickled/CBOR form of Python tuples, and on `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`
truncating it to 64 bits. Each `BlockStored` carries its blocks' token ids, so the router keys every
block with its own hash of the prompt's tokens up to that block's end, and keeps vLLM's hash only
to map `BlockRemoved` (which names vLLM's hashes) back to its own key. A prompt is keyed once per
request (`chain_keys`) and then looked up on every backend.

The key of a prompt's block i (counted from 0) is 2^20 · Σ_{j ≤ i} M_j · h(block j) + (i + 1):
h is Python's `hash` of the block's tokens as bytes — SipHash-1-3 under the process's own random
128-bit key (PYTHONHASHSEED unset) — and M_j a random odd 64-bit multiplier of the process for
position j; the low bits count the blocks (a stored block's children continue the sum from there).
Two prompts that differ in their leading blocks differ in some h_j, and their keys are equal only
if Σ M_j · (h_j − h'_j) = 0: for unpredictable h and M a chance of about 2^-64 per pair, whatever
the blocks' contents or order. A client never learns an h or an M, so it cannot craft colliding
token sequences; router replicas need not agree since each keeps its own index; and a collision
would only misplace a request, never serve it another's cache (the engine keys its own cache).
(Python's tuple hash would not do as the position's mix: it keeps additive differences, so two
blocks swapped collide.) Everything per block runs in C (`map`, `accumulate` over slices of one
byte string), where a chained BLAKE2b cost a Python-level call per block (docs/balance.md gives
the numbers). A process started with a fixed PYTHONHASHSEED has a known SipHash key; there h is a
BLAKE2b keyed by a secret of the process instead (slower).

Only `plain` blocks are indexed (no LoRA, multimodal or salted extra keys, GPU tier, first cache
group): those are what a text prompt's token ids alone address. A block whose parent the index
does not hold (its store was missed) cannot be keyed and is skipped.

Memory: per block one entry in each of two dicts, an integer key and vLLM's hash;
`BYTES_PER_BLOCK` is the measured bound (tests/fleet/test_kvindex.py). The multipliers are the
process's, one per block position of the longest chain met (about 44 bytes each: 360 KB for a
131,072-token prompt in blocks of 16), at most `MAX_CHAIN_BLOCKS`: a prompt is keyed, and a chain
indexed, up to that many blocks. `max_blocks` caps an index;
past it the oldest stored blocks are forgotten first (an engine evicts its own, so the cap binds
only when removals were lost).
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import accumulate, repeat, takewhile
from operator import add, mul
from typing import Final

from router.fleet.kvevents import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, KVEvent

# Measured on CPython 3.11 (tracemalloc, tests/fleet/test_kvindex.py): 151–206 bytes a block with
# vLLM's default int hashes, 180–235 with sha256 bytes, the upper end just after a dict doubles.
BYTES_PER_BLOCK: Final = 240
DEFAULT_MAX_BLOCKS: Final = 1 << 20  # ≈ 240 MiB per backend at worst; a vLLM GPU cache holds far fewer

POSITION_BITS: Final = 20  # a key's low bits: its block's number in the prompt
_POSITION: Final = (1 << POSITION_BITS) - 1
# The most leading blocks of a prompt keyed (2M tokens in blocks of 16): bounds the process's
# multipliers and slices, whatever length a client sends.
MAX_CHAIN_BLOCKS: Final = 1 << 17
_TOKEN: Final = "Q"  # tokens as unsigned 64-bit (the simulator's ids use more than 32 bits)
_TOKEN_BYTES: Final = 8
_ROOT: Final = 0  # the key "before" a prompt's first block: no blocks, an empty sum
_SECRET: Final = os.urandom(16)
# Python's str/bytes hashing is keyed by a secret of the process only when PYTHONHASHSEED is unset
# (or "random").
_SIPHASH_SECRET: Final = os.environ.get("PYTHONHASHSEED", "random") == "random"


def chain_keys(token_ids: Sequence[int], block_size: int) -> list[int]:
    """The router's keys of a prompt's full blocks, in order; a partial last block has none
    (vLLM caches full blocks only). A token id no engine has (negative, past 64 bits) makes no keys."""
    n = min(len(token_ids) // block_size, MAX_CHAIN_BLOCKS)
    try:
        raw = array(_TOKEN, token_ids[: n * block_size]).tobytes()
    except OverflowError:
        return []
    return _chain(raw, block_size, _ROOT, n)


def _chain(raw: bytes, block_size: int, parent: int, n: int) -> list[int]:
    """The keys of `n` blocks of `raw` continuing the prompt keyed `parent`."""
    first = parent & _POSITION
    blocks = map(raw.__getitem__, _slices(n, block_size * _TOKEN_BYTES))
    terms = map(add, map(mul, _block_hashes(blocks), _multipliers(first, n)), repeat(1))
    keys = list(accumulate(terms, initial=parent))
    del keys[0]
    return keys


_SLICES: Final[dict[int, list[slice]]] = {}


def _slices(n: int, step: int) -> list[slice]:
    """The first `n` blocks' slices of a byte string of blocks of `step` bytes."""
    made = _SLICES.setdefault(step, [])
    if len(made) < n:
        made.extend(slice(i * step, (i + 1) * step) for i in range(len(made), n))
    return made[:n]


_MULTIPLIERS: Final[list[int]] = []


def _multipliers(first: int, n: int) -> list[int]:
    """M_first … M_{first+n−1}, shifted past the position bits; drawn as positions are first met."""
    grow = first + n - len(_MULTIPLIERS)
    if grow > 0:
        _MULTIPLIERS.extend((secrets.randbits(64) | 1) << POSITION_BITS for _ in range(grow))
    return _MULTIPLIERS[first : first + n]


def _blake2b_blocks(blocks: Iterable[bytes]) -> Iterator[int]:
    for block in blocks:
        digest = hashlib.blake2b(block, digest_size=8, key=_SECRET).digest()
        yield int.from_bytes(digest, "little", signed=True)


_block_hashes: Final[Callable[[Iterable[bytes]], Iterator[int]]] = (
    functools.partial(map, hash) if _SIPHASH_SECRET else _blake2b_blocks
)


class BlockIndex:
    """One backend's cached blocks. `block_size` is learnt from the first block stored; blocks of
    another size (partial blocks of hybrid models) are skipped."""

    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        self._max = max_blocks
        self._by_hash: dict[BlockHash, int] = {}  # vLLM's hash → our key, oldest first
        self._held: dict[int, int] = {}  # our key → how many of vLLM's hashes name it
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

    def cached_tokens(self, keys: Sequence[int]) -> int:
        """How many leading tokens of the prompt keyed `keys` (chain_keys at this index's block
        size) the backend holds: O(blocks of the prompt), a dict lookup each, in C."""
        n = len(list(takewhile(self._held.__contains__, keys)))
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
        hashes = event.block_hashes
        n = max(0, min(len(hashes), MAX_CHAIN_BLOCKS - (parent & _POSITION)))
        self.skipped += len(hashes) - n  # past the longest prompt keyed
        try:
            raw = array(_TOKEN, event.token_ids[: n * event.block_size]).tobytes()
        except OverflowError:
            raw = b""
        if len(raw) != n * event.block_size * _TOKEN_BYTES:
            self.skipped += n  # token ids no prompt can have, or fewer than the blocks hold
            return
        for vllm_hash, key in zip(hashes[:n], _chain(raw, event.block_size, parent, n), strict=True):
            if vllm_hash not in self._by_hash:
                self._add(vllm_hash, key)

    def _add(self, vllm_hash: BlockHash, key: int) -> None:
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
