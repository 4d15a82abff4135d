"""Paged KV-cache bookkeeping: blocks, prefix sharing, refcounts, LRU eviction, copy-on-write.

A fixed pool of physical blocks of `block_size` token slots. Each sequence owns a block table;
its last block may be partial. A full block is identified by a chained content hash (the parent
block's hash and the block's token ids), so sequences with equal prefixes share the same
physical blocks. Blocks are reference counted; a block whose count drops to zero is kept, with
its content, in an LRU set of evictable cached blocks when it is full and hashed, and is evicted
(its hash forgotten) only when a fresh block is needed and no never-cached block is free.
Writing into a partial block that a forked sibling also references copies it first.

Given a `KVEventLog`, the manager reports what vLLM's KV cache manager publishes: a block stored
when it enters the prefix-cache index, removed when evicted from it, everything cleared on a
prefix-cache reset; each full block then also carries vLLM's hash of its content.

Layouts decide *which* free block a sequence gets, which shows in its compact spans (runs of
consecutive physical blocks):

* ``paged`` — the next block of a FIFO free queue (vLLM's behaviour);
* ``virtual-contiguous`` — the block right after the sequence's last block when free, otherwise
  the start of a free run long enough for the sequence's expected length;
* ``hybrid-prefix-shared`` — shared prefix blocks where they are, then one private contiguous
  tail: the tail never tries to extend from a shared block.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from router.lab.sim.kv_events import KVEventLog, block_digest

Layout = Literal["paged", "virtual-contiguous", "hybrid-prefix-shared"]
LAYOUTS: tuple[Layout, ...] = ("paged", "virtual-contiguous", "hybrid-prefix-shared")
ROOT_HASH = 0
_MAX_RUN = 256  # longest free run searched for at once, in blocks

_FREE = 0
_USED = 1


def block_hash(parent: int, tokens: Sequence[int]) -> int:
    """Chained content hash of one full block (Python's int-tuple hash is not salted)."""
    return hash((parent, *tokens))


def salted_root(salt: str | None) -> int:
    """The parent of a prompt's first block: its cache salt, when it has one, keys the first
    block (and so every block after it) apart from other salts' and unsalted prompts'."""
    return ROOT_HASH if not salt else hash(("cache_salt", salt))


def chain_hashes(token_ids: Sequence[int], block_size: int, parent: int = ROOT_HASH) -> list[int]:
    """Hashes of every full block of `token_ids`, each chained to the one before."""
    out: list[int] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_hash(parent, token_ids[start : start + block_size])
        out.append(parent)
    return out


def spans_of(blocks: Sequence[int]) -> list[tuple[int, int]]:
    """Runs of consecutive physical blocks as (first block, length)."""
    spans: list[tuple[int, int]] = []
    for b in blocks:
        if spans and spans[-1][0] + spans[-1][1] == b:
            spans[-1] = (spans[-1][0], spans[-1][1] + 1)
        else:
            spans.append((b, 1))
    return spans


def expand_spans(spans: Iterable[tuple[int, int]]) -> list[int]:
    return [start + i for start, length in spans for i in range(length)]


@dataclass(frozen=True, slots=True)
class LayoutStats:
    sequences: int
    blocks: int
    spans: int

    @property
    def blocks_per_sequence(self) -> float:
        return self.blocks / self.sequences if self.sequences else 0.0

    @property
    def spans_per_sequence(self) -> float:
        return self.spans / self.sequences if self.sequences else 0.0


@dataclass(slots=True)
class _Seq:
    blocks: list[int]
    hashes: list[int]  # chained hash of each full block, in table order
    num_tokens: int
    shared: int  # leading blocks taken from the cache or a parent at creation
    hint_blocks: int
    salt: str | None = None  # the prompt's cache salt: an extra key of its first block


class KVCacheManager:
    """Block pool plus per-sequence block tables. Every mutating call is atomic: it either
    succeeds or changes nothing (allocation failures return None/False)."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        *,
        layout: Layout = "paged",
        enable_prefix_caching: bool = True,
        events: KVEventLog | None = None,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be ≥ 1")
        if layout not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.layout: Layout = layout
        self.enable_prefix_caching = enable_prefix_caching
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._content: list[list[int]] = [[] for _ in range(num_blocks)]
        self._state = bytearray(num_blocks)
        self._free: deque[int] = deque(range(num_blocks))
        self._num_free = num_blocks
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._index: dict[int, int] = {}
        self._seqs: dict[Hashable, _Seq] = {}
        self._cursor = 0
        self.evictions = 0
        self.cow_copies = 0
        self._events = events
        # vLLM's digest of each sealed full block, kept only while events are reported.
        self._digest: list[bytes] = [b""] * num_blocks if events is not None else []

    # ---- queries -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks a new allocation can use: never-cached free blocks plus evictable ones."""
        return self._num_free + len(self._lru)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self._num_free - len(self._lru)

    @property
    def usage(self) -> float:
        """Fraction of blocks owned by live sequences (vLLM's kv_cache_usage_perc)."""
        return self.num_used_blocks / self.num_blocks

    def __contains__(self, seq_id: Hashable) -> bool:
        return seq_id in self._seqs

    def sequences(self) -> list[Hashable]:
        return list(self._seqs)

    def block_table(self, seq_id: Hashable) -> list[int]:
        return list(self._seqs[seq_id].blocks)

    def num_tokens(self, seq_id: Hashable) -> int:
        return self._seqs[seq_id].num_tokens

    def spans(self, seq_id: Hashable) -> list[tuple[int, int]]:
        return spans_of(self._seqs[seq_id].blocks)

    def tokens(self, seq_id: Hashable) -> list[int]:
        """The token ids stored for a sequence, read back from its blocks."""
        return [t for b in self._seqs[seq_id].blocks for t in self._content[b]]

    def refcount(self, block: int) -> int:
        return self._ref[block]

    def block_content(self, block: int) -> list[int]:
        return list(self._content[block])

    def is_free(self, block: int) -> bool:
        return self._state[block] == _FREE

    def cached_blocks(self) -> list[int]:
        """Evictable blocks, least recently freed first."""
        return list(self._lru)

    def index_items(self) -> Iterator[tuple[int, int]]:
        return iter(self._index.items())

    def sequence_hashes(self, seq_id: Hashable) -> list[int]:
        return list(self._seqs[seq_id].hashes)

    def layout_stats(self) -> LayoutStats:
        seqs = self._seqs.values()
        return LayoutStats(
            sequences=len(self._seqs),
            blocks=sum(len(s.blocks) for s in seqs),
            spans=sum(len(spans_of(s.blocks)) for s in seqs),
        )

    def match_prefix(self, hashes: Sequence[int]) -> list[int]:
        """Physical blocks of the longest cached prefix whose full-block hashes are `hashes`."""
        if not self.enable_prefix_caching:
            return []
        out: list[int] = []
        index = self._index
        for h in hashes:
            b = index.get(h)
            if b is None:
                break
            out.append(b)
        return out

    # ---- mutations -----------------------------------------------------------------------
    def allocate(
        self,
        seq_id: Hashable,
        token_ids: Sequence[int],
        *,
        prefix: Sequence[int] | None = None,
        hint_tokens: int = 0,
        salt: str | None = None,
    ) -> int | None:
        """Create a sequence holding `token_ids`. Its leading full blocks come from `prefix`
        (blocks returned by `match_prefix` for these tokens; matched here when None). Returns
        the number of tokens found cached, or None when there are not enough free blocks."""
        if seq_id in self._seqs:
            raise KeyError(f"sequence {seq_id!r} exists")
        bs = self.block_size
        if prefix is None:
            prefix = self.match_prefix(chain_hashes(token_ids, bs, salted_root(salt)))
        prefix = prefix[: len(token_ids) // bs]
        needed = -(-len(token_ids) // bs) - len(prefix)
        revived = sum(1 for b in prefix if self._ref[b] == 0)
        if needed > self.num_free_blocks - revived:
            return None
        for b in prefix:
            if self._ref[b] == 0:
                del self._lru[b]
            self._ref[b] += 1
        hint = max(hint_tokens, len(token_ids))
        seq = _Seq(
            blocks=list(prefix),
            hashes=[self._hash_of(b) for b in prefix],
            num_tokens=len(prefix) * bs,
            shared=len(prefix),
            hint_blocks=-(-hint // bs),
            salt=salt,
        )
        self._seqs[seq_id] = seq
        self._write(seq, token_ids[seq.num_tokens :])
        return len(prefix) * bs

    def can_append(self, seq_id: Hashable, num_tokens: int) -> bool:
        return self._blocks_needed(self._seqs[seq_id], num_tokens) <= self.num_free_blocks

    def append(self, seq_id: Hashable, token_ids: Sequence[int]) -> bool:
        """Append tokens to a sequence; False (and no change) when blocks run out."""
        seq = self._seqs[seq_id]
        if self._blocks_needed(seq, len(token_ids)) > self.num_free_blocks:
            return False
        self._write(seq, token_ids)
        return True

    def append_one(self, seq_id: Hashable, token: int) -> bool:
        """`append(seq_id, [token])`, the per-token decode path kept short."""
        seq = self._seqs[seq_id]
        if seq.num_tokens % self.block_size:
            b = seq.blocks[-1]
            if self._ref[b] == 1:
                content = self._content[b]
                content.append(token)
                seq.num_tokens += 1
                if len(content) == self.block_size:
                    self._seal(seq, b)
                return True
        return self.append(seq_id, (token,))

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """The child shares every block of the parent, the partial last block included."""
        if child_id in self._seqs:
            raise KeyError(f"sequence {child_id!r} exists")
        p = self._seqs[parent_id]
        for b in p.blocks:
            self._ref[b] += 1
        self._seqs[child_id] = _Seq(
            blocks=list(p.blocks),
            hashes=list(p.hashes),
            num_tokens=p.num_tokens,
            shared=len(p.blocks),
            hint_blocks=p.hint_blocks,
            salt=p.salt,
        )

    def free(self, seq_id: Hashable) -> None:
        seq = self._seqs.pop(seq_id)
        # Tail blocks first, so they are the first evicted (a shared head outlives its tails).
        for b in reversed(seq.blocks):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._release(b)

    def evict(self, n: int | None = None) -> int:
        """Evict up to `n` (all when None) least recently used cached blocks."""
        count = 0
        while self._lru and (n is None or count < n):
            b = self._evict_one()
            self._clear(b)
            count += 1
        return count

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block at once, as vLLM's reset does: only when no sequence holds
        a block (False and no change otherwise); one AllBlocksCleared, no per-block removals."""
        if self._seqs:
            return False
        for b in self._lru:
            self._hash[b] = None
            self._clear(b)
        self._lru.clear()
        self._index.clear()
        if self._events is not None:
            self._events.cleared()
        return True

    # ---- internals -----------------------------------------------------------------------
    def _hash_of(self, block: int) -> int:
        h = self._hash[block]
        if h is None:
            raise RuntimeError(f"block {block} is not a cached full block")
        return h

    def _blocks_needed(self, seq: _Seq, num_tokens: int) -> int:
        if num_tokens <= 0:
            return 0
        bs = self.block_size
        new = -(-(seq.num_tokens + num_tokens) // bs) - len(seq.blocks)
        fill = seq.num_tokens % bs
        cow = 1 if fill and self._ref[seq.blocks[-1]] > 1 else 0
        return new + cow

    def _write(self, seq: _Seq, tokens: Sequence[int]) -> None:
        bs = self.block_size
        i, n = 0, len(tokens)
        while i < n:
            fill = seq.num_tokens % bs
            if fill == 0:
                b = self._take_block(seq)
                seq.blocks.append(b)
            else:
                b = seq.blocks[-1]
                if self._ref[b] > 1:
                    b = self._copy_on_write(seq)
            take = min(bs - fill, n - i)
            content = self._content[b]
            content.extend(tokens[i : i + take])
            seq.num_tokens += take
            i += take
            if len(content) == bs:
                self._seal(seq, b)

    def _seal(self, seq: _Seq, block: int) -> None:
        parent = seq.hashes[-1] if seq.hashes else salted_root(seq.salt)
        h = block_hash(parent, self._content[block])
        seq.hashes.append(h)
        # A block computed twice at once (both missed the cache) stays unindexed: first wins.
        indexed = self.enable_prefix_caching and h not in self._index
        if indexed:
            self._index[h] = block
            self._hash[block] = h
        if self._events is not None:
            self._report_sealed(seq, block, indexed)

    def _report_sealed(self, seq: _Seq, block: int, indexed: bool) -> None:
        # The sealed block is the sequence's last; its parent, still held, has its digest.
        position = len(seq.hashes) - 1
        parent = self._digest[seq.blocks[position - 1]] if position else None
        content = self._content[block]
        salt = seq.salt if position == 0 else None
        digest = block_digest(parent, content, salt)
        self._digest[block] = digest
        if indexed and self._events is not None:
            self._events.stored(digest, parent, content, self.block_size, salt)

    def _copy_on_write(self, seq: _Seq) -> int:
        old = seq.blocks[-1]
        new = self._take_block(seq)
        self._content[new] = list(self._content[old])
        self._ref[old] -= 1  # was > 1, so another owner keeps it
        seq.blocks[-1] = new
        self.cow_copies += 1
        return new

    def _take_block(self, seq: _Seq) -> int:
        b = self._pick_free(seq)
        if b is None:
            b = self._evict_one()
        else:
            self._state[b] = _USED
            self._num_free -= 1
        self._ref[b] = 1
        self._content[b] = []
        return b

    def _pick_free(self, seq: _Seq) -> int | None:
        if self._num_free == 0:
            return None
        if self.layout == "paged":
            while True:
                b = self._free.popleft()
                if self._state[b] == _FREE:
                    return b
        extend = bool(seq.blocks) and (self.layout == "virtual-contiguous" or len(seq.blocks) > seq.shared)
        if extend:
            nxt = seq.blocks[-1] + 1
            if nxt < self.num_blocks and self._state[nxt] == _FREE:
                return nxt
        want = max(1, min(seq.hint_blocks - len(seq.blocks), _MAX_RUN))
        return self._find_run(want)

    def _find_run(self, length: int) -> int | None:
        state = self._state
        while length >= 1:
            pattern = bytes(length)
            i = state.find(pattern, self._cursor)
            if i < 0:
                i = state.find(pattern)
            if i >= 0:
                # The cursor skips the run, leaving it as the sequence's room to grow.
                self._cursor = (i + length) % self.num_blocks
                return i
            length //= 2
        return None

    def _evict_one(self) -> int:
        b, _ = self._lru.popitem(last=False)
        h = self._hash[b]
        if h is not None:
            del self._index[h]
            if self._events is not None:
                self._events.removed(self._digest[b])
        self._hash[b] = None
        self.evictions += 1
        return b

    def _release(self, b: int) -> None:
        if self._hash[b] is not None:
            self._lru[b] = None
        else:
            self._clear(b)

    def _clear(self, b: int) -> None:
        self._content[b] = []
        self._state[b] = _FREE
        self._num_free += 1
        if self.layout == "paged":
            self._free.append(b)
            if len(self._free) > 2 * self.num_blocks:
                self._compact_free_queue()

    def _compact_free_queue(self) -> None:
        seen: set[int] = set()
        kept: deque[int] = deque()
        for b in self._free:
            if self._state[b] == _FREE and b not in seen:
                seen.add(b)
                kept.append(b)
        self._free = kept
