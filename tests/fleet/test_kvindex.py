"""One backend's block index fed by its KV events: stores, removals, resets, the leading tokens it
holds of a prompt, and the memory a block costs."""

from __future__ import annotations

import gc
import random
import tracemalloc

from router.fleet.kvevents import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored
from router.fleet.kvindex import BYTES_PER_BLOCK, BlockIndex, chain_keys

BS = 4


def tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def store(
    hashes: list[BlockHash], parent: BlockHash | None, toks: list[int], plain: bool = True
) -> BlockStored:
    return BlockStored(
        block_hashes=tuple(hashes),
        parent_block_hash=parent,
        token_ids=tuple(toks),
        block_size=BS,
        plain=plain,
    )


def held(index: BlockIndex, prompt: list[int]) -> int:
    return index.cached_tokens(chain_keys(prompt, BS))


def test_a_stored_chain_covers_the_prompts_leading_full_blocks() -> None:
    index = BlockIndex()
    prompt = tokens(14)  # three full blocks and two tokens
    index.apply([store([1, 2], None, prompt[:8]), store([3], 2, prompt[8:12])])
    assert held(index, prompt) == 12
    assert held(index, prompt[:9]) == 8
    assert held(index, prompt[:4] + [99] * 10) == 4
    assert held(index, [99, *prompt[1:]]) == 0


def test_a_token_id_no_index_holds_ends_the_prompts_keys_before_its_block() -> None:
    index = BlockIndex()
    prompt = tokens(12)
    index.apply([store([1, 2, 3], None, prompt)])
    # Ids of 4 bytes at most are what engines store; a wider one (a simulator's salted id) or a
    # negative one cannot be in any block, so the prompt's keys stop before the block holding it.
    assert chain_keys([*prompt[:5], 1 << 40, *prompt[6:]], BS) == chain_keys(prompt[:4], BS)
    assert held(index, [*prompt[:9], -1, *prompt[10:]]) == 8
    assert chain_keys([1 << 33, *prompt[1:]], BS) == []


def test_a_removed_block_ends_the_prefix_there() -> None:
    index = BlockIndex()
    prompt = tokens(12)
    index.apply([store([1, 2, 3], None, prompt)])
    index.apply([BlockRemoved((2,), plain=True)])
    assert held(index, prompt) == 4
    index.apply([BlockRemoved((1, 3, 404), plain=True)])
    assert held(index, prompt) == 0
    assert len(index) == 0


def test_a_reset_clears_the_backend() -> None:
    index = BlockIndex()
    index.apply([store([1, 2], None, tokens(8)), AllBlocksCleared()])
    assert held(index, tokens(8)) == 0
    assert len(index) == 0


def test_the_same_tokens_after_another_prefix_are_another_block() -> None:
    index = BlockIndex()
    index.apply([store([1, 2], None, tokens(8))])
    assert held(index, tokens(4, start=4)) == 0


def test_blocks_whose_parent_was_missed_or_not_plain_are_skipped() -> None:
    index = BlockIndex()
    index.apply([store([5], 404, tokens(4, start=4)), store([6], None, tokens(4), plain=False)])
    assert held(index, tokens(8)) == 0
    assert index.skipped == 2


def test_a_block_named_by_two_hashes_stays_until_both_are_removed() -> None:
    index = BlockIndex()
    index.apply([store([1], None, tokens(4)), store([9], None, tokens(4))])
    index.apply([BlockRemoved((1,), plain=True)])
    assert held(index, tokens(4)) == 4
    index.apply([BlockRemoved((9,), plain=True)])
    assert held(index, tokens(4)) == 0


def test_the_cap_forgets_the_oldest_blocks_first() -> None:
    index = BlockIndex(max_blocks=3)
    first, second = tokens(8), tokens(8, start=100)
    index.apply([store([1, 2], None, first), store([3, 4], None, second)])
    assert len(index) == 3
    assert held(index, first) == 0  # block 1 forgotten: its child no longer counts
    assert held(index, second) == 8


def _chain(n: int, sha256: bool) -> list[BlockStored]:
    rng = random.Random(n)
    events: list[BlockStored] = []
    parent: BlockHash | None = None
    for i in range(n):
        h: BlockHash = rng.randbytes(32) if sha256 else rng.getrandbits(64)
        toks = tuple(tokens(16, start=16 * i))
        events.append(
            BlockStored(
                block_hashes=(h,), parent_block_hash=parent, token_ids=toks, block_size=16, plain=True
            )
        )
        parent = h
    return events


def test_a_block_costs_at_most_the_stated_bytes() -> None:
    # 43 691 blocks: just past the size at which both dicts double, the costliest point per block.
    for sha256 in (False, True):
        tracemalloc.start()
        try:
            index = BlockIndex()
            before = tracemalloc.get_traced_memory()[0]
            events = _chain(43_691, sha256)
            index.apply(events)
            del events
            gc.collect()
            per_block = (tracemalloc.get_traced_memory()[0] - before) / len(index)
        finally:
            tracemalloc.stop()
        assert len(index) == 43_691
        assert per_block <= BYTES_PER_BLOCK, (sha256, per_block)
