"""One backend's block index fed by its KV events: stores, removals, resets, the leading tokens it
holds of a prompt, and the memory a block costs."""

from __future__ import annotations

import gc
import os
import random
import subprocess
import sys
import tracemalloc

from router.fleet.kvevents import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored
from router.fleet.kvindex import BYTES_PER_BLOCK, MAX_CHAIN_BLOCKS, BlockIndex, Keyer

BS = 4


def tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def store(
    hashes: list[BlockHash],
    parent: BlockHash | None,
    toks: list[int],
    plain: bool = True,
    salt: str | None = None,
) -> BlockStored:
    return BlockStored(
        block_hashes=tuple(hashes),
        parent_block_hash=parent,
        token_ids=tuple(toks),
        block_size=BS,
        plain=plain,
        salt=salt,
    )


def held(index: BlockIndex, prompt: list[int], salt: str | None = None) -> int:
    return index.cached_tokens(index.keyer.chain_keys(prompt, BS, salt))


def test_a_stored_chain_covers_the_prompts_leading_full_blocks() -> None:
    index = BlockIndex()
    prompt = tokens(14)  # three full blocks and two tokens
    index.apply([store([1, 2], None, prompt[:8]), store([3], 2, prompt[8:12])])
    assert held(index, prompt) == 12
    assert held(index, prompt[:9]) == 8
    assert held(index, prompt[:4] + [99] * 10) == 4
    assert held(index, [99, *prompt[1:]]) == 0


def test_a_removed_block_ends_the_prefix_there() -> None:
    index = BlockIndex()
    prompt = tokens(12)
    index.apply([store([1, 2, 3], None, prompt)])
    index.apply([BlockRemoved((2,), plain=True)])
    assert held(index, prompt) == 4
    index.apply([BlockRemoved((1, 3, 404), plain=True)])
    assert held(index, prompt) == 0
    assert len(index) == 0


def test_a_salted_chain_is_held_for_its_salt_only() -> None:
    index = BlockIndex()
    prompt = tokens(12)
    index.apply([store([1, 2], None, prompt[:8], salt="tenant-a"), store([3], 2, prompt[8:])])
    assert held(index, prompt, "tenant-a") == 12
    assert held(index, prompt, "tenant-b") == 0
    assert held(index, prompt) == 0
    assert held(index, prompt, "") == 0  # an empty salt is none, as vLLM reads it


def test_an_unsalted_chain_is_not_held_for_a_salted_prompt() -> None:
    index = BlockIndex()
    index.apply([store([1, 2], None, tokens(8))])
    assert held(index, tokens(8)) == 8
    assert held(index, tokens(8), "") == 8
    assert held(index, tokens(8), "tenant-a") == 0


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
    # The multipliers of the chain's positions are the pool's keyer's, drawn once: not counted.
    keyer = Keyer()
    BlockIndex(keyer).apply(_chain(43_691, False))
    for sha256 in (False, True):
        tracemalloc.start()
        try:
            index = BlockIndex(keyer)
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


def test_token_ids_up_to_32_bits_are_indexed() -> None:
    prompt = [(1 << 32) - 1, (1 << 31) + 1, 7, 8, 9, 10, 11, 12]
    index = BlockIndex()
    index.apply([store([1, 2], None, prompt)])
    assert held(index, prompt) == 8


def test_token_ids_no_vocabulary_has_make_no_keys() -> None:
    keyer = Keyer()
    assert keyer.chain_keys([1, 2, 3, 1 << 32], BS) == []
    assert keyer.chain_keys([1, 2, -3, 4], BS) == []
    index = BlockIndex(keyer)
    index.apply([store([1], None, [1, 2, 3, 1 << 32]), store([2], None, [1, 2, 3, 1 << 63])])
    assert (len(index), index.skipped) == (0, 2)


def test_the_order_of_blocks_is_part_of_the_key() -> None:
    a, b = tokens(4), tokens(4, start=50)
    index = BlockIndex()
    index.apply([store([1, 2], None, a + b)])
    assert held(index, b + a) == 0
    assert held(index, a + a) == 4
    keys = index.keyer.chain_keys
    assert keys(a + b, BS)[0] == keys(a + a, BS)[0]
    assert len(set(keys(a + b, BS) + keys(b + a, BS))) == 4


def test_a_process_of_a_fixed_hash_seed_keys_with_its_own_secret() -> None:
    # Its SipHash key is known to anyone: the keys come from a secret of the process instead.
    script = (
        "from router.fleet import kvindex\n"
        "from router.fleet.kvevents import BlockStored\n"
        "index = kvindex.BlockIndex()\n"
        "assert index.keyer._block_hashes == index.keyer._blake2b_blocks\n"
        "toks = tuple(range(12))\n"
        "index.apply([BlockStored(block_hashes=(1, 2), parent_block_hash=None, token_ids=toks[:8],"
        " block_size=4, plain=True)])\n"
        "index.apply([BlockStored(block_hashes=(3,), parent_block_hash=2, token_ids=toks[8:],"
        " block_size=4, plain=True)])\n"
        "assert index.cached_tokens(index.keyer.chain_keys(list(toks), 4)) == 12\n"
        "print(index.keyer.chain_keys(list(toks), 4))\n"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": "7"},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for _ in range(2)
    ]
    assert runs[0] != runs[1]  # a secret of each process, not of the seed


def test_a_chain_is_keyed_up_to_the_longest_prompt_keyed() -> None:
    prompt = tokens((MAX_CHAIN_BLOCKS + 2) * BS)
    index = BlockIndex()
    keys = index.keyer.chain_keys(prompt, BS)
    assert len(keys) == MAX_CHAIN_BLOCKS
    hashes = list(range(1, MAX_CHAIN_BLOCKS + 3))
    index.apply([store(hashes, None, prompt)])
    assert (len(index), index.skipped) == (MAX_CHAIN_BLOCKS, 2)
    assert index.cached_tokens(keys) == MAX_CHAIN_BLOCKS * BS
