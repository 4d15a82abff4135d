"""Following a backend's KV event stream: sequence order, gaps replayed, restarts and unfillable
gaps clearing the index; and the subscriber against a publisher on real ZMQ sockets, framed as
vLLM 0.32's ZmqEventPublisher frames them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgpack
import zmq
import zmq.asyncio

from router.fleet.kvcaches import KVCaches
from router.fleet.kvevents import END_SEQ, BlockStored, EventBatch
from router.fleet.kvindex import CHUNK_TOKENS
from router.fleet.kvstream import Stream, start

BS = 4


def stored(seq: int, hashes: list[int], parent: int | None, first_token: int) -> EventBatch:
    toks = tuple(range(first_token, first_token + BS * len(hashes)))
    return EventBatch(
        seq,
        0.0,
        (
            BlockStored(
                block_hashes=tuple(hashes),
                parent_block_hash=parent,
                token_ids=toks,
                block_size=BS,
                plain=True,
            ),
        ),
        0,
    )


def held(stream: Stream, n_tokens: int) -> int:
    return stream.index.cached_tokens(stream.index.keyer.chain_keys(list(range(n_tokens)), BS))


def test_batches_in_order_are_applied() -> None:
    stream = Stream()
    assert stream.live(stored(0, [1], None, 0), 1.0) is None
    assert stream.live(stored(1, [2], 1, 4), 2.0) is None
    assert (stream.last_seq, stream.heard) == (1, 2.0)
    assert held(stream, 8) == 8


def test_a_gap_is_replayed_before_the_batch_that_revealed_it() -> None:
    stream = Stream()
    stream.live(stored(0, [1], None, 0), 1.0)
    later = stored(2, [3], 2, 8)
    assert stream.live(later, 2.0) == 1
    assert held(stream, 12) == 4  # the later batch waits for the replay
    stream.replayed(stored(0, [1], None, 0), 2.0)  # a replay starts where asked; older ones skipped
    stream.replayed(stored(1, [2], 1, 4), 2.0)
    stream.resume(later, 2.0)
    assert held(stream, 12) == 12
    assert (stream.gaps, stream.resets) == (1, 0)


def test_joining_a_publisher_midway_replays_its_history_first() -> None:
    stream = Stream()
    joined = stored(7, [3], 2, 8)
    assert stream.live(joined, 1.0) == 0
    stream.replayed(stored(5, [1], None, 0), 1.0)  # the engine's buffer has moved past 0…4
    stream.replayed(stored(6, [2], 1, 4), 1.0)
    stream.resume(joined, 1.0)
    assert held(stream, 12) == 12
    assert (stream.gaps, stream.resets) == (0, 0)


def test_joining_without_a_replay_keeps_what_the_batch_says() -> None:
    stream = Stream()
    joined = stored(7, [1], None, 0)
    assert stream.live(joined, 1.0) == 0
    stream.resume(joined, 1.0)
    assert held(stream, 4) == 4
    assert stream.resets == 0


def test_a_gap_the_replay_cannot_fill_starts_the_index_again() -> None:
    stream = Stream()
    stream.live(stored(0, [1], None, 0), 1.0)
    later = stored(9, [7], None, 100)
    assert stream.live(later, 2.0) == 1
    stream.resume(later, 2.0)
    assert held(stream, 4) == 0
    assert stream.last_seq == 9
    assert stream.resets == 1


def test_a_restarted_engines_stream_clears_the_index() -> None:
    stream = Stream()
    stream.live(stored(0, [1], None, 0), 1.0)
    stream.live(stored(1, [2], 1, 4), 1.0)
    assert stream.live(stored(0, [8], None, 50), 2.0) is None
    assert held(stream, 8) == 0
    assert stream.resets == 1


def test_each_backends_cached_tokens_none_where_its_stream_is_lost() -> None:
    holding, empty, lost = Stream(connected=True), Stream(connected=True), Stream(connected=False)
    holding.live(stored(0, [1, 2], None, 0), 1.0)
    lost.live(stored(0, [1, 2], None, 0), 1.0)
    caches = KVCaches()
    caches.streams.update({"a": holding, "b": empty, "c": lost})
    prompt = list(range(10))
    assert caches.cached_tokens(["a", "b", "c", "d"], prompt) == {"a": 8, "b": 0, "c": None, "d": None}


def test_a_long_prompt_is_credited_across_its_chunks_on_each_backend() -> None:
    caches = KVCaches()
    a, b = Stream(caches.index(), connected=True), Stream(caches.index(), connected=True)
    block = BS
    prompt = list(range(3 * CHUNK_TOKENS))
    chunk_blocks = CHUNK_TOKENS // block
    hashes = list(range(1, 2 * chunk_blocks + 1))
    a.index.apply(
        [
            BlockStored(
                block_hashes=tuple(hashes),
                parent_block_hash=None,
                token_ids=tuple(prompt[: len(hashes) * block]),
                block_size=block,
                plain=True,
            )
        ]
    )
    b.index.apply(
        [
            BlockStored(
                block_hashes=(1,),
                parent_block_hash=None,
                token_ids=tuple(prompt[:block]),
                block_size=block,
                plain=True,
            )
        ]
    )
    caches.streams.update({"a": a, "b": b})
    assert caches.cached_tokens(["a", "b"], prompt) == {"a": 2 * CHUNK_TOKENS, "b": block}
    assert caches.cached_tokens(["a", "b"], prompt, "tenant-a") == {"a": 0, "b": 0}


def payload(batch: EventBatch) -> bytes:
    """The batch as vLLM's msgspec encoder writes it (tests/fleet/test_kvevents.py holds the
    reference bytes this form is checked against)."""
    events = []
    for e in batch.events:
        assert isinstance(e, BlockStored)
        events.append(
            {
                "type": "BlockStored",
                "block_hashes": list(e.block_hashes),
                "parent_block_hash": e.parent_block_hash,
                "token_ids": list(e.token_ids),
                "block_size": e.block_size,
                "lora_id": None,
                "medium": "GPU",
                "lora_name": None,
                "group_idx": 0,
            }
        )
    packed: bytes = msgpack.packb([batch.ts, events, 0])
    return packed


async def wait_for(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def serve_replay(router: zmq.asyncio.Socket, buffer: list[tuple[int, bytes]]) -> None:
    """vLLM's replay service: one request, every buffered batch from its start, then the end mark."""
    while True:
        client, _, start_bytes = await router.recv_multipart()
        first = int.from_bytes(start_bytes, "big")
        for seq, buf in buffer:
            if seq >= first:
                await router.send_multipart([client, b"", b"", seq.to_bytes(8, "big"), buf])
        await router.send_multipart([client, b"", b"", END_SEQ, b""])


async def test_the_subscriber_replays_a_batch_the_publisher_dropped() -> None:
    ctx = zmq.asyncio.Context()
    # XPUB is PUB on the wire to the subscriber; it lets the test see the subscription arrive.
    pub = ctx.socket(zmq.XPUB)
    replay = ctx.socket(zmq.ROUTER)
    tasks: list[asyncio.Task[None]] = []
    try:
        pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
        replay_port = replay.bind_to_random_port("tcp://127.0.0.1")
        batches = [stored(0, [1], None, 0), stored(1, [2], 1, 4), stored(2, [3], 2, 8)]
        buffer = [(b.seq, payload(b)) for b in batches]
        tasks.append(asyncio.create_task(serve_replay(replay, buffer)))
        stream = Stream()
        tasks.append(start(ctx, f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}", stream))
        assert await asyncio.wait_for(pub.recv(), 20) == b"\x01"  # subscribed to every topic

        async def send(i: int) -> None:
            await pub.send_multipart([b"", buffer[i][0].to_bytes(8, "big"), buffer[i][1]])

        await send(0)
        await wait_for(lambda: stream.last_seq == 0, "first batch applied")
        await send(2)  # batch 1 never reaches the subscriber
        await wait_for(lambda: stream.last_seq == 2, "gap replayed and later batch applied")
        assert held(stream, 12) == 12
        assert (stream.gaps, stream.resets, stream.malformed) == (1, 0, 0)

        await pub.send_multipart([b"", (3).to_bytes(8, "big"), b"\xc1"])
        await wait_for(lambda: stream.malformed == 1, "malformed message counted")
        assert not tasks[1].done()  # the subscriber carries on
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        pub.close(linger=0)
        replay.close(linger=0)
        ctx.term()


async def test_a_lost_publisher_hides_the_index_until_it_is_back() -> None:
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.XPUB)
    task: asyncio.Task[None] | None = None
    stream = Stream()
    try:
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        assert stream.view() is None
        task = start(ctx, f"tcp://127.0.0.1:{port}", None, stream)
        assert await asyncio.wait_for(pub.recv(), 20) == b"\x01"
        await wait_for(lambda: stream.view() is stream.index, "connection seen")
        first = stored(0, [1], None, 0)
        await pub.send_multipart([b"", (0).to_bytes(8, "big"), payload(first)])
        await wait_for(lambda: stream.last_seq == 0, "first batch applied")

        pub.close(linger=0)  # the engine goes away
        await wait_for(lambda: stream.view() is None, "disconnection seen")

        pub = ctx.socket(zmq.XPUB)  # and comes back, restarted, on the same port
        pub.bind(f"tcp://127.0.0.1:{port}")
        assert await asyncio.wait_for(pub.recv(), 30) == b"\x01"
        await wait_for(lambda: stream.view() is stream.index, "reconnection seen")
        restarted = stored(0, [9], None, 100)
        await pub.send_multipart([b"", (0).to_bytes(8, "big"), payload(restarted)])
        await wait_for(lambda: stream.resets == 1, "restart cleared the index")
        assert held(stream, 4) == 0
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        pub.close(linger=0)
        ctx.term()
    assert not stream.connected


async def test_an_engine_restarted_past_its_old_sequence_while_away_keeps_none_of_its_old_blocks() -> None:
    """The restarted engine's sequence went beyond the old one before the router reconnected,
    so no sequence number says it restarted: the disconnection itself makes the index start
    again, rebuilt from the new engine's replay buffer."""
    ctx = zmq.asyncio.Context()
    pub, replay = ctx.socket(zmq.XPUB), ctx.socket(zmq.ROUTER)
    tasks: list[asyncio.Task[None]] = []
    stream = Stream()
    try:
        pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
        replay_port = replay.bind_to_random_port("tcp://127.0.0.1")
        tasks.append(start(ctx, f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}", stream))
        assert await asyncio.wait_for(pub.recv(), 20) == b"\x01"
        old = stored(0, [1, 2], None, 0)  # the old engine held tokens 0..7
        await pub.send_multipart([b"", (0).to_bytes(8, "big"), payload(old)])
        await wait_for(lambda: held(stream, 8) == 8, "old blocks applied")

        pub.close(linger=0)
        await wait_for(lambda: not stream.connected, "disconnection seen")
        # The new engine has published batches 0..5 of other tokens, kept in its replay buffer.
        history = [stored(i, [100 + i], None, 1000 + 4 * i) for i in range(6)]
        buffer = [(b.seq, payload(b)) for b in history]
        tasks.append(asyncio.create_task(serve_replay(replay, buffer)))
        pub = ctx.socket(zmq.XPUB)
        pub.bind(f"tcp://127.0.0.1:{pub_port}")
        assert await asyncio.wait_for(pub.recv(), 30) == b"\x01"
        await pub.send_multipart([b"", (6).to_bytes(8, "big"), payload(stored(6, [106], None, 1024))])
        await wait_for(lambda: stream.last_seq == 6, "the new engine's history replayed")
        assert held(stream, 8) == 0
        assert stream.index.cached_tokens(stream.index.keyer.chain_keys(list(range(1000, 1004)), BS)) == BS
        assert stream.resets == 1
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        pub.close(linger=0)
        replay.close(linger=0)
        ctx.term()
