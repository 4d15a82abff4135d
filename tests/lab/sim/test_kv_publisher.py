"""The simulator's KV event publisher, read by real ZMQ sockets on 127.0.0.1 the way a
subscriber of vLLM reads it: (topic, 8-byte big-endian sequence, msgpack batch) frames on SUB, and
a DEALER asking the replay endpoint for batches from a sequence number. Payloads are decoded by
hand with msgpack following vLLM's KVEventBatch schema."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import msgpack
import pytest
import zmq
from pydantic import ValidationError

from router.cli import parse_args
from router.lab.sim.cli import build_specs
from router.lab.sim.kv import KVCacheManager
from router.lab.sim.kv_events import KVEventLog, block_digest, encode_batch, external_hash
from router.lab.sim.kv_publisher import KVEventsConfig, ZmqKVEventPublisher
from router.lab.sim.serve import SimCluster
from router.lab.sim.token_ids import chat_token_ids
from tests.support.servers import free_port

WAIT_MS = 10_000
END = (-1).to_bytes(8, "big", signed=True)


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        yield context
    finally:
        context.destroy(linger=0)


def recv(sock: zmq.Socket[bytes]) -> list[bytes]:
    assert sock.poll(WAIT_MS), "nothing arrived"
    return sock.recv_multipart()


def payload(step: int) -> bytes:
    """The batch of one step of a real block manager: request `step` stores two blocks."""
    log = KVEventLog()
    kv = KVCacheManager(4, 4, events=log)
    kv.allocate(step, list(range(step * 100, step * 100 + 8)))
    return encode_batch(float(step), log.take())


def test_config_takes_vllms_json() -> None:
    config = KVEventsConfig.from_json(
        '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",'
        ' "replay_endpoint": "tcp://*:5558", "topic": "kv"}'
    )
    assert config.publishes and config.replay_endpoint == "tcp://*:5558" and config.buffer_steps == 10_000
    assert KVEventsConfig.from_json('{"enable_kv_cache_events": true}').publisher == "zmq"
    assert not KVEventsConfig.from_json("{}").publishes
    with pytest.raises(ValidationError):
        KVEventsConfig.from_json('{"enable_kv_cache_events": true, "endpiont": "tcp://*:1"}')
    # Several servers started together take consecutive ports, as vLLM's data-parallel ranks do.
    second = config.for_server(1)
    assert (second.endpoint, second.replay_endpoint) == ("tcp://*:5558", "tcp://*:5559")
    assert KVEventsConfig(endpoint="tcp://127.0.0.1:0").for_server(2).endpoint == "tcp://127.0.0.1:0"


def test_a_subscriber_receives_batches_in_order_with_consecutive_sequence_numbers(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    sub = ctx.socket(zmq.SUB)
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    # An endpoint without "*" is connected to, as vLLM's publisher does.
    config = KVEventsConfig(enable_kv_cache_events=True, endpoint=f"tcp://127.0.0.1:{port}", topic="kv")
    publisher = ZmqKVEventPublisher(config, context=ctx)
    try:
        # A PUB drops what it sends before the subscriber is attached: send until one arrives.
        deadline = time.monotonic() + WAIT_MS / 1000
        first: list[bytes] = []
        while not first:
            assert time.monotonic() < deadline, "the subscriber never attached"
            publisher.publish(payload(0))
            if sub.poll(50):
                first = sub.recv_multipart()
        seq0 = int.from_bytes(first[1], "big")
        for step in range(1, 6):
            publisher.publish(payload(step))
        # Warm-up batches still in flight come first; then steps 1..5, nothing skipped.
        frames = recv(sub)
        while msgpack.unpackb(frames[2])[0] == 0.0:
            frames = recv(sub)
        seqs, steps = [], []
        for i in range(5):
            if i:
                frames = recv(sub)
            topic, seq, body = frames
            assert topic == b"kv" and len(seq) == 8
            ts, events, rank = msgpack.unpackb(body)
            assert rank == 0 and events[0]["type"] == "BlockStored"
            assert events[0]["token_ids"] == list(range(int(ts) * 100, int(ts) * 100 + 8))
            seqs.append(int.from_bytes(seq, "big"))
            steps.append(int(ts))
        assert steps == [1, 2, 3, 4, 5]
        assert seqs[0] > seq0 and seqs == list(range(seqs[0], seqs[0] + 5))
    finally:
        publisher.close()


def test_the_replay_endpoint_resends_kept_batches_from_a_sequence_number(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    config = KVEventsConfig.from_json(
        '{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:1",'
        ' "replay_endpoint": "tcp://127.0.0.1:*", "buffer_steps": 3}'
    )
    publisher = ZmqKVEventPublisher(config, context=ctx)
    dealer = ctx.socket(zmq.DEALER)
    try:
        for step in range(5):
            publisher.publish(payload(step))
        assert publisher.replay_endpoint is not None
        dealer.connect(publisher.replay_endpoint)

        def replay(start: int) -> list[tuple[int, float]]:
            dealer.send_multipart((b"", start.to_bytes(8, "big")))
            got = []
            while True:
                empty, topic, seq, body = recv(dealer)
                assert empty == b"" and topic == b""
                if seq == END:
                    assert body == b""
                    return got
                got.append((int.from_bytes(seq, "big"), msgpack.unpackb(body)[0]))

        assert replay(3) == [(3, 3.0), (4, 4.0)]
        assert replay(0) == [(2, 2.0), (3, 3.0), (4, 4.0)]  # only the last three are kept
        assert replay(5) == []
    finally:
        dealer.close(linger=0)
        publisher.close()


async def test_a_simulated_server_lists_its_publisher_and_replays_what_a_request_cached() -> None:
    args = parse_args(
        [
            "sim",
            "--port",
            str(free_port()),
            "--preset",
            "cpu-tiny",
            "--served-model-name",
            "tiny",
            "--block-size",
            "16",
            "--kv-events-config",
            '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:*",'
            ' "replay_endpoint": "tcp://127.0.0.1:*", "topic": "kv"}',
        ]
    )
    messages = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog. " * 12}]
    async with SimCluster(build_specs(args)) as cluster, httpx.AsyncClient(base_url=cluster.urls[0]) as http:
        sources = (await http.get("/kv_event_sources")).json()
        assert list(sources) == ["0"]
        source = sources["0"]
        assert source["enable_kv_cache_events"] and source["topic"] == "kv"
        assert source["endpoint"].startswith("tcp://127.0.0.1:") and not source["endpoint"].endswith("*")
        reply = await http.post(
            "/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 2}
        )
        assert reply.status_code == 200

        # The request has finished, so every batch of its steps was handed to the publisher.
        batches = await asyncio.to_thread(replay_all, source["replay_endpoint"])

    assert [seq for seq, _ in batches] == list(range(len(batches)))
    stored = {
        h
        for _, (_ts, events, _rank) in batches
        for e in events
        if e["type"] == "BlockStored"
        for h in e["block_hashes"]
    }
    block_size = build_specs(args)[0].config.block_size
    prompt = chat_token_ids(messages)
    assert len(prompt) >= 3 * block_size
    expected: list[int] = []
    parent: bytes | None = None
    for i in range(0, len(prompt) - block_size + 1, block_size):
        parent = block_digest(parent, prompt[i : i + block_size])
        expected.append(external_hash(parent))
    assert set(expected) <= stored


def replay_all(endpoint: str) -> list[tuple[int, list[Any]]]:
    """Every batch the replay endpoint keeps, from sequence 0."""
    with zmq.Context() as context, context.socket(zmq.DEALER) as dealer:
        dealer.connect(endpoint)
        dealer.send_multipart((b"", (0).to_bytes(8, "big")))
        got = []
        while True:
            _, topic, seq, body = recv(dealer)
            if seq == END:
                return got
            assert topic == b"kv"
            got.append((int.from_bytes(seq, "big"), msgpack.unpackb(body)))
