"""The block manager's KV cache events, and their encoding checked against vLLM 0.32's own.

The expected hashes and bytes below were produced by vLLM 0.32 itself (`hash_block_tokens` with
its default sha256 and `msgspec.msgpack.encode` of a `KVEventBatch`); the rest decodes batches by
hand with msgpack, following vLLM's schema.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgpack

from router.fleet.kvevents import decode_message
from router.fleet.kvindex import BlockIndex
from router.lab.sim.kv import KVCacheManager
from router.lab.sim.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventLog,
    block_digest,
    encode_batch,
    external_hash,
)
from router.lab.sim.token_ids import chat_token_ids

BS = 4

# vLLM 0.32: [(1, 2, 3, 4), (5, 6, 7, 8)] hashed as a chain, published form.
VLLM_CHAIN = [1882140585328457242, 15284023028817948126]

# vLLM 0.32: msgspec.msgpack.encode(KVEventBatch(ts=1.5, events=[BlockStored(block_hashes=[5,
# 2**63 + 1], parent_block_hash=None, token_ids=[1, 2], block_size=2, lora_id=None, medium="GPU",
# lora_name=None, group_idx=0), BlockRemoved(block_hashes=[5], medium="GPU", group_idx=0),
# AllBlocksCleared()], data_parallel_rank=0))
VLLM_BATCH = bytes.fromhex(
    "93cb3ff80000000000009389a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573920"
    "5cf8000000000000001b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473920102aa626c"
    "6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0a967726f"
    "75705f6964780084a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739105a66d65"
    "6469756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400"
)


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def chain(token_ids: Sequence[int]) -> list[int]:
    """Published hashes of every full block of `token_ids`, chained as vLLM chains them."""
    out: list[int] = []
    parent: bytes | None = None
    for i in range(0, len(token_ids) - BS + 1, BS):
        parent = block_digest(parent, token_ids[i : i + BS])
        out.append(external_hash(parent))
    return out


def decode(events: list[KVEvent]) -> list[dict[str, object]]:
    """The events as a subscriber reads them off the wire."""
    _ts, decoded, rank = msgpack.unpackb(encode_batch(0.0, events))
    assert rank == 0
    return list(decoded)


def hashes_of(event: dict[str, object]) -> list[int]:
    hashes = event.get("block_hashes", [])
    assert isinstance(hashes, list)
    return hashes


def fold(index: set[int], events: list[dict[str, object]]) -> None:
    """What a subscriber's index of this engine holds after the events."""
    for e in events:
        hashes = hashes_of(e)
        if e["type"] == "BlockStored":
            parent = e["parent_block_hash"]
            assert parent is None or parent in index or parent in hashes
            index.update(hashes)
        elif e["type"] == "BlockRemoved":
            assert set(hashes) <= index
            index.difference_update(hashes)
        else:
            assert e["type"] == "AllBlocksCleared"
            index.clear()


def test_block_hashes_are_vllms() -> None:
    assert chain([1, 2, 3, 4, 5, 6, 7, 8]) == VLLM_CHAIN


def test_a_batch_encodes_byte_for_byte_as_vllm_encodes_it() -> None:
    five, big = (5).to_bytes(32, "big"), (2**63 + 1).to_bytes(32, "big")
    events: list[KVEvent] = [
        BlockStored([five, big], None, [1, 2], 2),
        BlockRemoved(five),
        AllBlocksCleared(),
    ]
    assert encode_batch(1.5, events) == VLLM_BATCH


def test_stored_shared_evicted_and_cleared_blocks_are_reported() -> None:
    log = KVEventLog()
    kv = KVCacheManager(6, BS, events=log)
    index: set[int] = set()

    a = toks(0, 10)  # two full blocks and a partial one
    kv.allocate("a", a)
    stored = decode(log.take())
    assert stored == [
        {
            "type": "BlockStored",
            "block_hashes": chain(a),
            "parent_block_hash": None,
            "token_ids": a[:8],
            "block_size": BS,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
            "group_idx": 0,
        }
    ]
    fold(index, stored)

    b = [*a[:8], 90, 91, 92, 93]  # shares a's two full blocks, fills a third of its own
    assert kv.allocate("b", b) == 8
    shared = decode(log.take())
    assert [(e["block_hashes"], e["parent_block_hash"], e["token_ids"]) for e in shared] == [
        (chain(b)[2:], chain(a)[1], [90, 91, 92, 93])
    ]
    fold(index, shared)
    assert index == set(chain(b))

    kv.free("a")
    kv.free("b")
    assert log.take() == []  # freed blocks stay cached: nothing leaves the index

    c = toks(100, 24)  # six full blocks: every cached block must be evicted for them
    kv.allocate("c", c)
    pressure = decode(log.take())
    removed = {h for e in pressure if e["type"] == "BlockRemoved" for h in hashes_of(e)}
    assert removed == set(chain(b))
    fold(index, pressure)
    assert index == set(chain(c))

    assert not kv.reset_prefix_cache()  # c still holds its blocks
    assert log.take() == []
    kv.free("c")
    assert kv.reset_prefix_cache()
    cleared = decode(log.take())
    assert cleared == [{"type": "AllBlocksCleared"}]
    fold(index, cleared)
    assert index == set()
    assert kv.allocate("d", c) == 0  # nothing is cached any more


def test_a_chat_prompts_blocks_reach_the_routers_index() -> None:
    # The simulator's token ids of a chat prompt (role markers, non-ASCII text) are ids a real
    # vocabulary could hold: the router's decoder takes the batch and its index finds the prompt.
    messages = [{"role": "system", "content": "Rules: é " * 30}, {"role": "user", "content": "why? " * 40}]
    prompt = chat_token_ids(messages)
    kv = KVCacheManager(64, BS, events=(log := KVEventLog()))
    assert kv.allocate("a", prompt) == 0
    batch = decode_message((b"kv", (0).to_bytes(8, "big"), encode_batch(0.0, log.take())))
    assert batch is not None
    index = BlockIndex()
    index.apply(batch.events)
    full = len(prompt) // BS * BS
    assert index.cached_tokens(index.keyer.chain_keys(prompt, BS)) == full
