"""Invariants of a KVCacheManager, checked only through its public introspection."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from router.lab.sim.kv import KVCacheManager, chain_hashes, expand_spans


def check_invariants(kv: KVCacheManager, expected: Mapping[Any, Sequence[int]]) -> None:
    """`expected` maps every live sequence to the tokens it must hold."""
    assert set(kv.sequences()) == set(expected)
    owners: Counter[int] = Counter()
    for seq_id, tokens in expected.items():
        table = kv.block_table(seq_id)
        assert len(set(table)) == len(table), "a block appears twice in one table"
        owners.update(table)
        # Contents: what each owner reads back is exactly what it wrote (COW isolation).
        assert kv.tokens(seq_id) == list(tokens)
        assert kv.num_tokens(seq_id) == len(tokens)
        assert len(table) == -(-len(tokens) // kv.block_size)
        # Spans are a lossless compression of the table.
        assert expand_spans(kv.spans(seq_id)) == table
        assert kv.sequence_hashes(seq_id) == chain_hashes(list(tokens), kv.block_size)
    cached = set(kv.cached_blocks())
    for b in range(kv.num_blocks):
        assert kv.refcount(b) == owners[b], f"block {b}: refcount != owners"
        if kv.is_free(b):
            assert owners[b] == 0 and b not in cached, f"block {b} free and owned/cached"
            assert kv.block_content(b) == []
    for b in cached:
        assert kv.refcount(b) == 0
        assert len(kv.block_content(b)) == kv.block_size
    indexed = dict(kv.index_items())
    assert len(set(indexed.values())) == len(indexed), "a block indexed under two hashes"
    for b in indexed.values():
        assert not kv.is_free(b)
        assert len(kv.block_content(b)) == kv.block_size
        assert b in cached or owners[b] > 0
    # Every cached block is reachable by its hash (otherwise it could never be hit again).
    assert cached <= set(indexed.values())
    # Whatever the index says for a live sequence's hash has that sequence's block content.
    for seq_id in expected:
        table = kv.block_table(seq_id)
        for i, h in enumerate(kv.sequence_hashes(seq_id)):
            if h in indexed:
                assert kv.block_content(indexed[h]) == kv.block_content(table[i])
    assert kv.num_free_blocks + kv.num_used_blocks == kv.num_blocks
    assert kv.num_used_blocks == len(owners)
