"""What one engine holds in its prefix cache, as its KV events tell it: an index of its blocks,
queried with a prompt's token ids for the number of leading tokens the engine has cached.

Pure, no I/O: the subscriber (one per backend) applies decoded batches (router/fleet/kvevents.py).

Keying. The index does not reproduce vLLM's block hash: that depends on the engine's
`--prefix-caching-hash-algo`, on a seed that is random per process for the non-cryptographic
algorithms, on the pickled/CBOR form of Python tuples, and on `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`
truncating it to 64 bits. Each `BlockStored` carries its blocks' token ids, so the router keys every
block with its own hash of the prompt's tokens up to that block's end, and keeps vLLM's hash only
to map `BlockRemoved` (which names vLLM's hashes) back to its own key. A `Keyer` holds the keying's
secrets; a pool's indexes and the lookups over them share one (router/fleet/kvcaches.py), which
keys a prompt once per request and looks the keys up on every backend.

The key of a prompt's block i (counted from 0) is R + 2^20 · Σ_{j ≤ i} M_j · h(block j) + (i + 1):
h is Python's `hash` of the block's tokens as bytes (unsigned 32-bit each) — SipHash-1-3 under the
process's own random 128-bit key (PYTHONHASHSEED unset) — and M_j a random odd 64-bit multiplier of
the keyer for position j; the low bits count the blocks (a stored block's children continue the sum
from there). R, the root, is 0 for an unsalted prompt; for a prompt with a cache salt (which vLLM
mixes into the prompt's first block only) it is 2^20 times a 64-bit BLAKE2b of the salt keyed by
the keyer's secret. Two prompts whose leading blocks or salts differ have equal keys only if R − R'
+ 2^20 · Σ M_j · (h_j − h'_j) = 0 in exact integers (the counts being equal): as the h, M and R are
unknown and independent of the tokens, a chance of about 2^-63 per pair, whatever the blocks'
contents or order — so one salt's lookup never credits another salt's blocks, nor unsalted ones
(nor the reverse) but by such a collision. A client never learns an h, M or R, so it cannot craft
colliding token sequences or salts; router replicas need not agree since each keeps its own index;
and a collision would only misplace a request, never serve it another's cache (the engine keys its
own cache). (Python's tuple hash would not do as the position's mix: it keeps additive differences,
so two blocks swapped collide.) Everything per block runs in C (`map`, `accumulate` over slices of
one byte string), where a chained BLAKE2b cost a Python-level call per block (docs/balance.md gives
the numbers). A process started with a fixed PYTHONHASHSEED has a known SipHash key; there h is a
BLAKE2b keyed by the keyer's secret instead (slower).

Token ids are keyed as unsigned 32-bit integers, as every real vocabulary's (and the simulator's)
fit: a prompt holding an id past 32 bits makes no keys from the chunk holding it on, and a stored
block holding one is not indexed (the decoder accepts ids up to 64 bits; such blocks are counted
`skipped`). A lookup keys the prompt's first CHUNK_TOKENS tokens, and the rest only when some
backend holds all of those: a prompt no backend holds costs that chunk's keying.

Only `plain` blocks are indexed (no LoRA, multimodal or prompt-embedding extra keys, GPU tier,
first cache group; a cache salt on a chain's first block is keyed as its root): those are what a
text prompt's token ids and salt alone address. A block whose parent the index does not hold (its
store was missed) cannot be keyed and is skipped.

Memory: per block one entry in each of two dicts, an integer key and vLLM's hash;
`BYTES_PER_BLOCK` is the measured bound (tests/fleet/test_kvindex.py). The multipliers are the
keyer's (one per pool), one per block position of the longest chain met (about 44 bytes each:
360 KB for a 131,072-token prompt in blocks of 16), at most `MAX_CHAIN_BLOCKS`: a prompt is keyed,
and a chain indexed, up to that many blocks. `max_blocks` caps an index; past it the oldest stored
blocks are forgotten first (an engine evicts its own, so the cap binds only when removals were
lost).
"""

from __future__ import annotations

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
# The most leading blocks of a prompt keyed (2M tokens in blocks of 16): bounds a keyer's
# multipliers and slices, whatever length a client sends.
MAX_CHAIN_BLOCKS: Final = 1 << 17
_TOKEN: Final = "I"  # tokens as unsigned 32-bit: a real vocabulary, and the simulator's ids, fit
_TOKEN_BYTES: Final = array(_TOKEN).itemsize
# A lookup keys a prompt's first this many tokens, and the rest only if some backend holds them all.
CHUNK_TOKENS: Final = 1024
_UNSALTED: Final = 0  # the key "before" an unsalted prompt's first block: no blocks, an empty sum


def _siphash_is_secret() -> bool:
    """Python's str/bytes hashing is keyed by a secret of the process only when PYTHONHASHSEED is
    unset (or "random")."""
    return os.environ.get("PYTHONHASHSEED", "random") == "random"


class Keyer:
    """The router's keys of prompts' blocks: its secrets (the BLAKE2b key, the multipliers M_j)
    and what it reuses between prompts (slices). The indexes of one pool and the lookups over them
    share one keyer; two keyers' keys of one prompt are unrelated."""

    def __init__(self) -> None:
        self._secret = os.urandom(16)
        self._multipliers: list[int] = []
        self._slices: dict[int, list[slice]] = {}
        self._block_hashes: Callable[[Iterable[bytes]], Iterator[int]] = (
            self._siphash_blocks if _siphash_is_secret() else self._blake2b_blocks
        )

    def root(self, salt: str | None) -> int:
        """The key before a prompt's first block: 0 unsalted; for a cache salt, a secret 64-bit
        value of the salt, shifted past the position bits (its position is 0, as the empty sum's)."""
        if not salt:  # vLLM ignores an empty salt
            return _UNSALTED
        digest = hashlib.blake2b(
            salt.encode(), digest_size=8, key=self._secret, person=b"cache_salt"
        ).digest()
        return int.from_bytes(digest, "little") << POSITION_BITS

    def chain_keys(self, token_ids: Sequence[int], block_size: int, salt: str | None = None) -> list[int]:
        """The keys of a prompt's full blocks, in order; a partial last block has none (vLLM
        caches full blocks only). A token id past 32 bits (or negative) makes no keys from its
        chunk on."""
        return [key for chunk in self.chunks(token_ids, block_size, salt) for key in chunk]

    def chunks(
        self, token_ids: Sequence[int], block_size: int, salt: str | None = None
    ) -> Iterator[list[int]]:
        """`chain_keys` lazily, in two chunks: the blocks of the first CHUNK_TOKENS tokens, then
        the rest. A lookup that finds the first chunk held whole nowhere keys no further."""
        n = min(len(token_ids) // block_size, MAX_CHAIN_BLOCKS)
        head = min(n, max(1, CHUNK_TOKENS // block_size))
        parent = self.root(salt)
        for first, count in ((0, head), (head, n - head)):
            if count <= 0:
                return
            try:
                raw = array(_TOKEN, token_ids[first * block_size : (first + count) * block_size]).tobytes()
            except OverflowError:
                return
            keys = self.chain(raw, block_size, parent, count)
            yield keys
            parent = keys[-1]

    def chain(self, raw: bytes, block_size: int, parent: int, n: int) -> list[int]:
        """The keys of `n` blocks of `raw` (tokens as unsigned 32-bit) continuing the prompt keyed
        `parent`."""
        first = parent & _POSITION
        blocks = map(raw.__getitem__, self._slices_of(n, block_size * _TOKEN_BYTES))
        terms = map(add, map(mul, self._block_hashes(blocks), self._multipliers_at(first, n)), repeat(1))
        keys = list(accumulate(terms, initial=parent))
        del keys[0]
        return keys

    def _slices_of(self, n: int, step: int) -> list[slice]:
        """The first `n` blocks' slices of a byte string of blocks of `step` bytes."""
        made = self._slices.setdefault(step, [])
        if len(made) < n:
            made.extend(slice(i * step, (i + 1) * step) for i in range(len(made), n))
        return made[:n]

    def _multipliers_at(self, first: int, n: int) -> list[int]:
        """M_first … M_{first+n−1}, shifted past the position bits; drawn as positions are first met."""
        made = self._multipliers
        grow = first + n - len(made)
        if grow > 0:
            made.extend((secrets.randbits(64) | 1) << POSITION_BITS for _ in range(grow))
        return made[first : first + n]

    @staticmethod
    def _siphash_blocks(blocks: Iterable[bytes]) -> Iterator[int]:
        return map(hash, blocks)

    def _blake2b_blocks(self, blocks: Iterable[bytes]) -> Iterator[int]:
        key = self._secret
        for block in blocks:
            digest = hashlib.blake2b(block, digest_size=8, key=key).digest()
            yield int.from_bytes(digest, "little", signed=True)


class BlockIndex:
    """One backend's cached blocks, keyed by `keyer` (a pool's indexes share their pool's: a
    prompt is keyed once for all). `block_size` is learnt from the first block stored; blocks of
    another size (partial blocks of hybrid models) are skipped."""

    def __init__(self, keyer: Keyer | None = None, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        self.keyer = keyer if keyer is not None else Keyer()
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
        """How many leading tokens of the prompt keyed `keys` (its keyer's chain_keys at this
        index's block size) the backend holds: O(blocks of the prompt), a dict lookup each, in C."""
        return self.held_blocks(keys) * (self.block_size or 0)

    def held_blocks(self, keys: Sequence[int]) -> int:
        """How many of `keys`, from the first, the backend holds."""
        return len(list(takewhile(self._held.__contains__, keys)))

    def _store(self, event: BlockStored) -> None:
        if self.block_size is None and event.plain:
            self.block_size = event.block_size
        if not event.plain or event.block_size != self.block_size:
            self.skipped += len(event.block_hashes)
            return
        if event.parent_block_hash is None:
            parent = self.keyer.root(event.salt)
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
        for vllm_hash, key in zip(
            hashes[:n], self.keyer.chain(raw, event.block_size, parent, n), strict=True
        ):
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
