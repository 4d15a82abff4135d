"""Property-based tests: random allocate/append/fork/free/evict sequences keep every invariant."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from router.lab.sim.kv import LAYOUTS, KVCacheManager, Layout, chain_hashes, expand_spans, spans_of
from router.lab.sim.kv_events import AllBlocksCleared, BlockRemoved, KVEventLog, block_digest, external_hash

from .kv_invariants import check_invariants

BS = 4
NUM_BLOCKS = 24
# A few shared stems make prefix hits common; a tail of random tokens makes sequences differ.
STEMS = [list(range(100 * s, 100 * s + 13)) for s in range(3)]

token_lists = st.builds(
    lambda stem, cut, tail: [*STEMS[stem][:cut], *tail],
    st.integers(0, len(STEMS) - 1),
    st.integers(0, 13),
    st.lists(st.integers(0, 5), max_size=10),
)


class KVMachine(RuleBasedStateMachine):
    layout: Layout = "paged"
    with_events = False
    seqs = Bundle("seqs")

    def __init__(self) -> None:
        super().__init__()
        self.log = KVEventLog() if self.with_events else None
        self.kv = KVCacheManager(NUM_BLOCKS, BS, layout=self.layout, events=self.log)
        # What a subscriber of the events holds, and vLLM's hash of each chain hash seen.
        self.subscriber: set[int] = set()
        self.vllm_hash: dict[int, int] = {}
        self.model: dict[int, list[int]] = {}
        self.next_id = 0
        self.seen_chains: list[list[int]] = []

    def _fresh_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _index_snapshot(self) -> dict[int, int]:
        return dict(self.kv.index_items())

    def _check_index_loss(self, before: dict[int, int], evictions_before: int) -> None:
        """Index entries disappear only by eviction, and only while owned by nobody."""
        after = self._index_snapshot()
        lost = set(before) - set(after)
        assert len(lost) == self.kv.evictions - evictions_before
        for h in set(before) & set(after):
            assert before[h] == after[h]

    def _remember(self, tokens: list[int]) -> None:
        chain = chain_hashes(tokens, BS)
        if chain:
            self.seen_chains.append(chain)
        parent: bytes | None = None
        for i, h in enumerate(chain):
            parent = block_digest(parent, tokens[i * BS : (i + 1) * BS])
            self.vllm_hash[h] = external_hash(parent)

    @rule(target=seqs, tokens=token_lists, hint=st.integers(0, 40))
    def allocate(self, tokens: list[int], hint: int) -> int:
        seq_id = self._fresh_id()
        before, ev = self._index_snapshot(), self.kv.evictions
        expected_hit = len(self.kv.match_prefix(chain_hashes(tokens, BS))) * BS
        hit = self.kv.allocate(seq_id, tokens, hint_tokens=hint)
        self._check_index_loss(before, ev)
        if hit is None:
            return -1
        assert hit == expected_hit
        self.model[seq_id] = list(tokens)
        self._remember(tokens)
        return seq_id

    @rule(seq=seqs, extra=st.lists(st.integers(0, 5), min_size=1, max_size=9))
    def append(self, seq: int, extra: list[int]) -> None:
        if seq not in self.model:
            return
        before, ev = self._index_snapshot(), self.kv.evictions
        could = self.kv.can_append(seq, len(extra))
        ok = self.kv.append(seq, extra)
        assert ok == could
        self._check_index_loss(before, ev)
        if ok:
            self.model[seq].extend(extra)
            self._remember(self.model[seq])

    @rule(target=seqs, seq=seqs)
    def fork(self, seq: int) -> int:
        if seq not in self.model:
            return -1
        child = self._fresh_id()
        self.kv.fork(seq, child)
        self.model[child] = list(self.model[seq])
        return child

    @rule(seq=consumes(seqs))
    def free(self, seq: int) -> None:
        if seq not in self.model:
            return
        before, ev = self._index_snapshot(), self.kv.evictions
        self.kv.free(seq)
        del self.model[seq]
        self._check_index_loss(before, ev)

    @precondition(lambda self: bool(self.kv.cached_blocks()))
    @rule(n=st.integers(1, 4))
    def evict(self, n: int) -> None:
        victims = self.kv.cached_blocks()[:n]
        before, ev = self._index_snapshot(), self.kv.evictions
        assert self.kv.evict(n) == len(victims)
        self._check_index_loss(before, ev)
        assert all(self.kv.is_free(b) for b in victims)

    @invariant()
    def all_invariants_hold(self) -> None:
        check_invariants(self.kv, self.model)

    @invariant()
    def seen_prefixes_are_found_until_evicted(self) -> None:
        index = dict(self.kv.index_items())
        for chain in self.seen_chains:
            found = self.kv.match_prefix(chain)
            n = len(found)
            assert found == [index[h] for h in chain[:n]]
            assert n == len(chain) or chain[n] not in index


class EventsMachine(KVMachine):
    """With events on, a subscriber folding them holds exactly the blocks the cache indexes."""

    with_events = True

    @rule()
    def reset(self) -> None:
        assert self.kv.reset_prefix_cache() == (not self.kv.sequences())

    @invariant()
    def the_subscriber_holds_what_is_cached(self) -> None:
        assert self.log is not None
        for event in self.log.take():
            if isinstance(event, AllBlocksCleared):
                self.subscriber.clear()
            elif isinstance(event, BlockRemoved):
                self.subscriber.remove(external_hash(event.digest))
            else:
                assert event.parent is None or external_hash(event.parent) in self.vllm_hash.values()
                self.subscriber.update(external_hash(d) for d in event.digests)
        assert self.subscriber == {self.vllm_hash[h] for h, _ in self.kv.index_items()}


class PagedMachine(KVMachine):
    layout = "paged"


class VirtualContiguousMachine(KVMachine):
    layout = "virtual-contiguous"


class HybridPrefixSharedMachine(KVMachine):
    layout = "hybrid-prefix-shared"


_settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestPagedKV = PagedMachine.TestCase
TestPagedKV.settings = _settings
TestVirtualContiguousKV = VirtualContiguousMachine.TestCase
TestVirtualContiguousKV.settings = _settings
TestHybridPrefixSharedKV = HybridPrefixSharedMachine.TestCase
TestHybridPrefixSharedKV.settings = _settings
TestKVEvents = EventsMachine.TestCase
TestKVEvents.settings = _settings


@given(st.lists(st.integers(0, 50), max_size=30))
def test_spans_expand_back_to_any_block_list(blocks: list[int]) -> None:
    spans = spans_of(blocks)
    assert expand_spans(spans) == blocks
    assert all(length >= 1 for _, length in spans)
    # Adjacent spans never continue each other (the compression is maximal).
    assert all(a[0] + a[1] != b[0] for a, b in itertools.pairwise(spans))


@given(st.sampled_from(LAYOUTS), st.lists(st.integers(1, 30), min_size=1, max_size=8))
def test_any_layout_holds_the_same_tokens(layout: Layout, lengths: list[int]) -> None:
    kv = KVCacheManager(64, BS, layout=layout)
    model: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        tokens = list(range(i * 1000, i * 1000 + n))
        if kv.allocate(i, tokens) is not None:
            model[i] = tokens
    check_invariants(kv, model)
