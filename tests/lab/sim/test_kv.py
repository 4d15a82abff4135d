from __future__ import annotations

import pytest

from router.lab.sim.kv import (
    KVCacheManager,
    Layout,
    block_hash,
    chain_hashes,
    expand_spans,
    spans_of,
)

from .kv_invariants import check_invariants

BS = 4


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_allocate_stores_tokens_in_ceil_blocks() -> None:
    kv = KVCacheManager(8, BS)
    assert kv.allocate("a", toks(0, 10)) == 0
    assert len(kv.block_table("a")) == 3
    assert kv.tokens("a") == toks(0, 10)
    check_invariants(kv, {"a": toks(0, 10)})


def test_partial_last_block_is_filled_by_append_before_a_new_block() -> None:
    kv = KVCacheManager(8, BS)
    kv.allocate("a", toks(0, 5))
    table = kv.block_table("a")
    assert kv.append("a", [100, 101, 102])
    assert kv.block_table("a") == table  # the partial block absorbed all three
    assert kv.append("a", [103])
    assert len(kv.block_table("a")) == 3
    check_invariants(kv, {"a": [*toks(0, 5), 100, 101, 102, 103]})


def test_equal_prefixes_share_physical_blocks() -> None:
    kv = KVCacheManager(16, BS)
    kv.allocate("a", toks(0, 9))
    hit = kv.allocate("b", [*toks(0, 8), 77, 78])
    assert hit == 8
    assert kv.block_table("a")[:2] == kv.block_table("b")[:2]
    assert kv.block_table("a")[2] != kv.block_table("b")[2]
    assert [kv.refcount(b) for b in kv.block_table("b")[:2]] == [2, 2]
    check_invariants(kv, {"a": toks(0, 9), "b": [*toks(0, 8), 77, 78]})


def test_freed_full_blocks_stay_cached_and_are_hit_again() -> None:
    kv = KVCacheManager(16, BS)
    kv.allocate("a", toks(0, 10))
    full = kv.block_table("a")[:2]
    kv.free("a")
    assert set(kv.cached_blocks()) == set(full)
    assert kv.usage == 0.0
    assert kv.allocate("b", toks(0, 10)) == 8
    assert kv.block_table("b")[:2] == full
    assert kv.cached_blocks() == []
    check_invariants(kv, {"b": toks(0, 10)})


def test_partial_blocks_are_not_cached_on_free() -> None:
    kv = KVCacheManager(16, BS)
    kv.allocate("a", toks(0, 6))
    partial = kv.block_table("a")[1]
    kv.free("a")
    assert kv.is_free(partial)
    assert partial not in kv.cached_blocks()


def test_eviction_takes_least_recently_freed_first() -> None:
    kv = KVCacheManager(4, BS)
    kv.allocate("old", toks(0, 4))
    kv.allocate("new", toks(100, 4))
    old_block, new_block = kv.block_table("old")[0], kv.block_table("new")[0]
    kv.free("old")
    kv.free("new")
    kv.allocate("x", toks(200, 12))  # 2 never-used blocks + 1 eviction
    assert kv.evictions == 1
    assert kv.is_free(old_block) is False and old_block in kv.block_table("x")
    assert kv.match_prefix(chain_hashes(toks(100, 4), BS)) == [new_block]
    assert kv.match_prefix(chain_hashes(toks(0, 4), BS)) == []


def test_tail_blocks_are_evicted_before_the_head_of_a_freed_sequence() -> None:
    kv = KVCacheManager(3, BS)
    kv.allocate("a", toks(0, 12))
    head, _, tail = kv.block_table("a")
    kv.free("a")
    kv.allocate("x", toks(500, 4))
    assert kv.block_table("x") == [tail]
    assert kv.match_prefix(chain_hashes(toks(0, 12), BS))[:1] == [head]


def test_owned_blocks_are_never_evicted_allocation_fails_instead() -> None:
    kv = KVCacheManager(4, BS)
    kv.allocate("a", toks(0, 16))
    before = kv.block_table("a")
    assert kv.allocate("b", toks(50, 1)) is None
    assert "b" not in kv
    assert kv.block_table("a") == before and kv.evictions == 0
    check_invariants(kv, {"a": toks(0, 16)})


def test_failed_append_changes_nothing() -> None:
    kv = KVCacheManager(3, BS)
    kv.allocate("a", toks(0, 8))
    kv.allocate("b", toks(100, 3))
    assert not kv.append("a", toks(9, 5))
    check_invariants(kv, {"a": toks(0, 8), "b": toks(100, 3)})
    kv.free("b")
    assert kv.can_append("a", 4) and not kv.can_append("a", 5)


def test_fork_shares_every_block_including_the_partial_one() -> None:
    kv = KVCacheManager(8, BS)
    kv.allocate("p", toks(0, 6))
    kv.fork("p", "c")
    assert kv.block_table("c") == kv.block_table("p")
    assert all(kv.refcount(b) == 2 for b in kv.block_table("p"))
    check_invariants(kv, {"p": toks(0, 6), "c": toks(0, 6)})


def test_copy_on_write_keeps_the_other_owner_content() -> None:
    kv = KVCacheManager(8, BS)
    kv.allocate("p", toks(0, 6))
    kv.fork("p", "c")
    shared_partial = kv.block_table("p")[1]
    assert kv.append("c", [900])
    assert kv.cow_copies == 1
    assert kv.block_table("c")[1] != shared_partial
    assert kv.block_table("p")[1] == shared_partial
    assert kv.block_content(shared_partial) == [4, 5]
    assert kv.append("p", [800])  # now private again: no second copy
    assert kv.cow_copies == 1
    check_invariants(kv, {"p": [*toks(0, 6), 800], "c": [*toks(0, 6), 900]})


def test_fork_at_a_block_boundary_needs_no_copy() -> None:
    kv = KVCacheManager(8, BS)
    kv.allocate("p", toks(0, 8))
    kv.fork("p", "c")
    assert kv.append("c", [1]) and kv.append("p", [2])
    assert kv.cow_copies == 0
    check_invariants(kv, {"p": [*toks(0, 8), 2], "c": [*toks(0, 8), 1]})


def test_copy_on_write_needs_a_free_block() -> None:
    kv = KVCacheManager(2, BS)
    kv.allocate("p", toks(0, 6))
    kv.fork("p", "c")
    assert not kv.can_append("c", 1)
    assert not kv.append("c", [9])
    check_invariants(kv, {"p": toks(0, 6), "c": toks(0, 6)})


def test_freeing_a_fork_keeps_the_parent() -> None:
    kv = KVCacheManager(8, BS)
    kv.allocate("p", toks(0, 6))
    kv.fork("p", "c")
    kv.free("c")
    assert all(kv.refcount(b) == 1 for b in kv.block_table("p"))
    check_invariants(kv, {"p": toks(0, 6)})


def test_same_block_content_at_another_position_is_not_shared() -> None:
    kv = KVCacheManager(8, BS)
    kv.allocate("a", [*toks(0, 4), *toks(10, 4)])
    assert kv.allocate("b", [*toks(20, 4), *toks(10, 4)]) == 0
    assert kv.block_table("a")[1] != kv.block_table("b")[1]


def test_chain_hash_depends_on_parent_and_content() -> None:
    assert block_hash(1, [1, 2]) != block_hash(2, [1, 2])
    assert block_hash(1, [1, 2]) != block_hash(1, [2, 1])
    assert chain_hashes(toks(0, 11), BS) == chain_hashes(toks(0, 8), BS)
    assert len(chain_hashes(toks(0, 3), BS)) == 0


def test_match_prefix_stops_at_the_first_miss() -> None:
    kv = KVCacheManager(8, BS)
    kv.allocate("a", toks(0, 12))
    hashes = chain_hashes([*toks(0, 4), 99, 99, 99, 99, *toks(8, 4)], BS)
    assert kv.match_prefix(hashes) == kv.block_table("a")[:1]


def test_prefix_caching_disabled_shares_nothing() -> None:
    kv = KVCacheManager(8, BS, enable_prefix_caching=False)
    kv.allocate("a", toks(0, 8))
    assert kv.allocate("b", toks(0, 8)) == 0
    assert dict(kv.index_items()) == {}
    kv.free("a")
    assert kv.cached_blocks() == []
    check_invariants(kv, {"b": toks(0, 8)})


def test_concurrent_duplicates_first_one_wins_the_index() -> None:
    kv = KVCacheManager(8, BS)
    # Both computed without a hit (as two requests admitted in one step would be).
    kv.allocate("a", toks(0, 4), prefix=[])
    kv.allocate("b", toks(0, 4), prefix=[])
    a, b = kv.block_table("a")[0], kv.block_table("b")[0]
    assert dict(kv.index_items()) == {chain_hashes(toks(0, 4), BS)[0]: a}
    kv.free("b")
    assert kv.is_free(b)
    kv.free("a")
    assert kv.cached_blocks() == [a]


def test_revived_cached_blocks_do_not_count_as_free_for_the_same_allocation() -> None:
    kv = KVCacheManager(3, BS)
    kv.allocate("a", toks(0, 8))
    kv.free("a")  # 2 cached + 1 free
    # Reusing both cached blocks leaves exactly one block for the rest.
    assert kv.allocate("b", toks(0, 13)) is None
    assert kv.allocate("b", toks(0, 12)) == 8
    check_invariants(kv, {"b": toks(0, 12)})


def test_explicit_evict_forgets_hashes() -> None:
    kv = KVCacheManager(8, BS)
    kv.allocate("a", toks(0, 8))
    kv.free("a")
    assert kv.evict(1) == 1
    assert len(kv.cached_blocks()) == 1
    assert kv.evict() == 1
    assert dict(kv.index_items()) == {}
    assert kv.num_free_blocks == 8
    check_invariants(kv, {})


def test_usage_counts_owned_blocks_only() -> None:
    kv = KVCacheManager(10, BS)
    kv.allocate("a", toks(0, 8))
    kv.allocate("b", toks(0, 9))
    assert kv.num_used_blocks == 3
    assert kv.usage == pytest.approx(0.3)
    kv.free("a")
    kv.free("b")
    assert kv.usage == 0.0 and kv.num_free_blocks == 10


def test_spans_roundtrip_simple() -> None:
    blocks = [3, 4, 5, 9, 10, 2]
    assert spans_of(blocks) == [(3, 3), (9, 2), (2, 1)]
    assert expand_spans(spans_of(blocks)) == blocks
    assert spans_of([]) == []


def grow_interleaved(layout: Layout, n_seqs: int = 4, steps: int = 40) -> KVCacheManager:
    kv = KVCacheManager(512, BS, layout=layout)
    for s in range(n_seqs):
        kv.allocate(s, toks(1000 * s, 3), hint_tokens=3 + steps)
    for step in range(steps):
        for s in range(n_seqs):
            assert kv.append(s, [step])
    return kv


def test_virtual_contiguous_keeps_interleaved_growth_in_one_span_each() -> None:
    kv = grow_interleaved("virtual-contiguous")
    assert [len(kv.spans(s)) for s in range(4)] == [1, 1, 1, 1]
    stats = kv.layout_stats()
    assert stats.spans_per_sequence == 1.0
    assert stats.blocks_per_sequence == pytest.approx(-(-43 // BS))


def test_paged_layout_fragments_interleaved_growth() -> None:
    kv = grow_interleaved("paged")
    assert kv.layout_stats().spans_per_sequence > 5


def test_hybrid_layout_shared_prefix_then_one_private_tail() -> None:
    kv = KVCacheManager(256, BS, layout="hybrid-prefix-shared")
    prefix = toks(0, 16)
    kv.allocate("a", [*prefix, 1, 2], hint_tokens=60)
    kv.allocate("b", [*prefix, 3, 4], hint_tokens=60)
    for i in range(40):
        assert kv.append("a", [i]) and kv.append("b", [i])
    shared = kv.block_table("a")[:4]
    assert kv.block_table("b")[:4] == shared
    tail_b = kv.block_table("b")[4:]
    assert spans_of(tail_b) == [(tail_b[0], len(tail_b))]
    assert len(kv.spans("b")) <= len(spans_of(shared)) + 1


def test_virtual_contiguous_extends_after_a_cache_hit_when_possible() -> None:
    kv = KVCacheManager(64, BS, layout="virtual-contiguous")
    kv.allocate("a", toks(0, 8), hint_tokens=8)
    kv.free("a")
    kv.evict()  # blocks free again but hashes gone
    kv.allocate("b", toks(0, 8), hint_tokens=40)
    assert len(kv.spans("b")) == 1


def test_unknown_layout_and_bad_sizes_rejected() -> None:
    with pytest.raises(ValueError):
        KVCacheManager(4, BS, layout="striped")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        KVCacheManager(0, BS)


def test_duplicate_sequence_ids_rejected() -> None:
    kv = KVCacheManager(4, BS)
    kv.allocate("a", toks(0, 2))
    with pytest.raises(KeyError):
        kv.allocate("a", toks(0, 2))
    with pytest.raises(KeyError):
        kv.fork("a", "a")
