"""Publishing KV event batches over ZMQ the way vLLM does, from `--kv-events-config`.

Every batch goes out on a PUB socket as three frames: topic, sequence number (8 bytes, big
endian, counting from 0) and the msgpack payload. The last `buffer_steps` payloads are kept; a
ROUTER socket on `replay_endpoint` answers a request carrying a start sequence number (8 bytes,
big endian) with every kept batch from that number on, each as ``(b"", topic, seq, payload)``
after the requester's identity, then an end marker ``(b"", b"", -1 as 8 signed bytes, b"")``.

An endpoint with ``*`` (or ipc/inproc) is bound, any other is connected to, as vLLM does; the
replay endpoint is always bound. One thread owns both sockets (ZMQ sockets are not thread-safe):
callers hand it batches through a bounded queue.
"""

from __future__ import annotations

import json
import queue
import threading
from collections import deque
from typing import Literal, Self

import zmq
from pydantic import BaseModel, ConfigDict, Field, model_validator

_END_SEQ = (-1).to_bytes(8, "big", signed=True)
_POLL_MS = 20  # how long the thread waits on replay requests before looking at its queue


class KVEventsConfig(BaseModel):
    """vLLM's `--kv-events-config` (the same keys and defaults)."""

    model_config = ConfigDict(extra="forbid")

    enable_kv_cache_events: bool = False
    publisher: Literal["null", "zmq"] | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = Field(10_000, ge=1)
    hwm: int = Field(100_000, ge=0)
    max_queue_size: int = Field(100_000, ge=1)
    topic: str = ""

    @model_validator(mode="after")
    def _default_publisher(self) -> Self:
        if self.publisher is None:
            self.publisher = "zmq" if self.enable_kv_cache_events else "null"
        return self

    @classmethod
    def from_json(cls, text: str) -> KVEventsConfig:
        return cls.model_validate(json.loads(text))

    @property
    def publishes(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"

    def for_server(self, index: int) -> KVEventsConfig:
        """The endpoints of the `index`-th server of several started together: TCP ports moved
        up by `index`, as vLLM moves them for each data-parallel rank (port 0 stays 0)."""
        return self.model_copy(
            update={
                "endpoint": offset_port(self.endpoint, index),
                "replay_endpoint": None
                if self.replay_endpoint is None
                else offset_port(self.replay_endpoint, index),
            }
        )


def offset_port(endpoint: str, index: int) -> str:
    if index == 0:
        return endpoint
    if not endpoint.startswith("tcp://"):
        return f"{endpoint}_{index}"  # ipc or inproc: a path of its own
    base, _, port = endpoint.rpartition(":")
    if port.isdigit() and int(port):
        return f"{base}:{int(port) + index}"
    return endpoint  # a port the system chooses


def binds(endpoint: str) -> bool:
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqKVEventPublisher:
    """Sequence-numbered PUB stream of encoded batches, with a bounded replay buffer."""

    def __init__(
        self, config: KVEventsConfig, *, context: zmq.Context[zmq.Socket[bytes]] | None = None
    ) -> None:
        self._ctx = context or zmq.Context.instance()
        self._config = config
        self._topic = config.topic.encode()
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._next_seq = 0
        self._pub = self._ctx.socket(zmq.PUB)
        self._replay: zmq.Socket[bytes] | None = None
        try:
            self._pub.set_hwm(config.hwm)
            self.endpoint = self._attach(self._pub, config.endpoint)
            self.replay_endpoint: str | None = None
            if config.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.bind(config.replay_endpoint)
                self.replay_endpoint = self._resolved(self._replay, config.replay_endpoint)
        except BaseException:
            self._close_sockets()
            raise
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    @property
    def config(self) -> KVEventsConfig:
        """The configuration with the endpoints as bound, what `GET /kv_event_sources` lists."""
        return self._config.model_copy(
            update={"endpoint": self.endpoint, "replay_endpoint": self.replay_endpoint}
        )

    def publish(self, payload: bytes) -> None:
        """Queue one encoded batch; it gets the next sequence number when sent."""
        self._queue.put(payload)

    def close(self) -> None:
        """Send what is queued, then stop and close the sockets."""
        self._queue.put(None)
        self._thread.join()
        self._close_sockets()

    def _attach(self, sock: zmq.Socket[bytes], endpoint: str) -> str:
        if not binds(endpoint):
            sock.connect(endpoint)
            return endpoint
        sock.bind(endpoint)
        return self._resolved(sock, endpoint)

    @staticmethod
    def _resolved(sock: zmq.Socket[bytes], endpoint: str) -> str:
        # An endpoint is reported as given, but a port the system chose must be reported.
        if endpoint.endswith((":0", ":*")):
            return sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return endpoint

    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    def _run(self) -> None:
        poller = zmq.Poller()
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        while True:
            if self._replay is None:
                if not self._drain_blocking():
                    return
                continue
            ready = dict(poller.poll(_POLL_MS))
            # Batches handed in before a request arrived are sent (and kept) before it is served.
            if not self._drain():
                return
            if ready.get(self._replay):
                self._serve_replay(self._replay)

    def _drain_blocking(self) -> bool:
        payload = self._queue.get()
        if payload is None:
            return False
        self._send(payload)
        return self._drain()

    def _drain(self) -> bool:
        """Send every queued batch; False once the stop marker is reached."""
        while True:
            try:
                payload = self._queue.get_nowait()
            except queue.Empty:
                return True
            if payload is None:
                return False
            self._send(payload)

    def _send(self, payload: bytes) -> None:
        seq = self._next_seq
        self._next_seq += 1
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))

    def _serve_replay(self, sock: zmq.Socket[bytes]) -> None:
        frames = sock.recv_multipart()
        if len(frames) != 3:
            return  # not a replay request: vLLM ignores it too
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in self._buffer:
            if seq >= first:
                sock.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), payload))
        sock.send_multipart((client, b"", b"", _END_SEQ, b""))
