"""Following one backend's KV event stream into its block index (router/fleet/kvindex.py).

`Stream` is the pure part: it applies batches in sequence order, says when batches were lost and
from where to replay them, and clears the index when the engine restarted (its sequence starts
again) or when lost batches could not be replayed. `follow` is the I/O edge: a SUB socket on the
engine's publisher and, for gaps, a DEALER socket on its replay endpoint. ZMQ reconnects a SUB
socket by itself when the engine goes away and comes back.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Final

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from router.fleet.kvevents import (
    EventBatch,
    Step,
    decode_message,
    is_end_marker,
    replay_request,
    sequence_step,
)
from router.fleet.kvindex import BlockIndex

REPLAY_TIMEOUT_S: Final = 2.0
RECONNECT_IVL_MS: Final = 500
RECONNECT_IVL_MAX_MS: Final = 5000
# The most batches a SUB socket queues while the router is busy; past it ZMQ drops, a gap follows.
RCVHWM: Final = 100_000
# ZMTP heartbeats: a publisher whose host vanished without closing the connection (no FIN) is
# seen as disconnected after HEARTBEAT_TIMEOUT_MS, not when TCP gives up minutes later.
HEARTBEAT_IVL_MS: Final = 5000
HEARTBEAT_TIMEOUT_MS: Final = 15000


@dataclass(slots=True)
class Stream:
    """One backend's stream as the router has followed it. `heard`: the monotonic time of the last
    batch applied (None: never); `connected`: the SUB socket holds a connection to the publisher;
    `resets`: how often the index was cleared for lost or restarted history; `malformed`: messages
    refused; `batches`: batches applied. `peers`: the streams of the engine's other data-parallel
    ranks, which share this index; the index is shown only while all of them are connected."""

    index: BlockIndex = field(default_factory=BlockIndex)
    last_seq: int | None = None
    heard: float | None = None
    connected: bool = False
    malformed: int = 0
    gaps: int = 0
    resets: int = 0
    batches: int = 0
    peers: tuple[Stream, ...] = ()

    @property
    def all_connected(self) -> bool:
        return self.connected and all(p.connected for p in self.peers)

    def view(self) -> BlockIndex | None:
        """The index, while the publisher is connected; None when the stream is lost (the index
        may miss the engine's evictions since), so placement falls back to approximation."""
        return self.index if self.all_connected else None

    def live(self, batch: EventBatch, now: float) -> int | None:
        """A batch from the publisher. Returns the sequence number to replay from when batches
        were lost before it, or when the router joins a publisher that has published before (the
        engine's history rebuilds the index); the caller replays them (`replayed`) and then calls
        `resume(batch)`. Otherwise the batch is applied."""
        step = sequence_step(self.last_seq, batch.seq)
        if step.step is Step.FIRST and batch.seq > 0:
            return 0
        if step.step is Step.GAP:
            self.gaps += 1
            return step.missing_from
        if step.step is Step.BEHIND:
            # A live stream never goes back: the engine restarted with an empty cache.
            self.index.clear()
            self.resets += 1
        self._apply(batch, now)
        return None

    def lost(self) -> None:
        """The connection to the publisher dropped. What the engine did meanwhile is unknown — it
        may have restarted and published more than its old sequence since, which no sequence
        number would reveal — so the index starts again, and the first batch after reconnection
        asks the replay endpoint for the engine's history (`live`)."""
        self.connected = False
        if self.last_seq is not None or len(self.index):
            self.index.clear()
            self.last_seq = None
            self.resets += 1

    def replayed(self, batch: EventBatch, now: float) -> None:
        if sequence_step(self.last_seq, batch.seq).step in (Step.FIRST, Step.NEXT):
            self._apply(batch, now)

    def resume(self, batch: EventBatch, now: float) -> None:
        """Apply the live batch that revealed a gap, after the replay; if the replay did not fill
        the gap, what the index holds can no longer be trusted, so it starts again empty. (A
        replay of the history before the first batch may come back short when the engine's
        buffer has moved on: blocks whose parents are missing are then skipped.)"""
        if self.last_seq is not None and self.last_seq + 1 != batch.seq:
            self.index.clear()
            self.resets += 1
        self._apply(batch, now)

    def _apply(self, batch: EventBatch, now: float) -> None:
        self.index.apply(batch.events)
        self.last_seq = batch.seq
        self.heard = now
        self.batches += 1


async def follow(
    ctx: zmq.asyncio.Context, endpoint: str, replay_endpoint: str | None, stream: Stream
) -> None:
    """Apply the publisher at `endpoint` to `stream` until cancelled."""
    sub = ctx.socket(zmq.SUB)
    monitor: zmq.asyncio.Socket | None = None
    try:
        sub.setsockopt(zmq.RCVHWM, RCVHWM)
        sub.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
        sub.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        sub.setsockopt(zmq.IPV6, 1)  # an engine at an IPv6 address
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        sub.connect(endpoint)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        while True:
            ready = dict(await poller.poll())
            if monitor in ready:
                _connection(await monitor.recv_multipart(), stream)
            if sub in ready:
                await _receive(ctx, await sub.recv_multipart(), replay_endpoint, stream)
    finally:
        stream.connected = False
        if monitor is not None:
            sub.disable_monitor()
            monitor.close(linger=0)
        sub.close(linger=0)


def _connection(frames: list[bytes], stream: Stream) -> None:
    event = parse_monitor_message(frames)["event"]
    if event == zmq.EVENT_CONNECTED:
        stream.connected = True
    elif event == zmq.EVENT_DISCONNECTED:
        stream.lost()


async def _receive(
    ctx: zmq.asyncio.Context, frames: list[bytes], replay_endpoint: str | None, stream: Stream
) -> None:
    batch = decode_message(frames)
    if batch is None:
        stream.malformed += 1
        return
    start = stream.live(batch, time.monotonic())
    if start is not None:
        if replay_endpoint is not None:
            await _replay(ctx, replay_endpoint, start, batch.seq, stream)
        stream.resume(batch, time.monotonic())


async def _replay(ctx: zmq.asyncio.Context, endpoint: str, start: int, until: int, stream: Stream) -> None:
    """Ask the engine's replay socket for batches `start`… and apply those before `until`."""
    dealer = ctx.socket(zmq.DEALER)
    try:
        dealer.setsockopt(zmq.IPV6, 1)
        dealer.connect(endpoint)
        await dealer.send_multipart([b"", replay_request(start)])
        deadline = time.monotonic() + REPLAY_TIMEOUT_S
        while (left := deadline - time.monotonic()) > 0:
            if not await dealer.poll(left * 1000):
                return
            frames = await dealer.recv_multipart()
            message = frames[1:]  # the envelope's empty delimiter
            if is_end_marker(message):
                return
            batch = decode_message(message)
            if batch is None:
                stream.malformed += 1
            elif batch.seq < until:
                stream.replayed(batch, time.monotonic())
    finally:
        dealer.close(linger=0)


def start(
    ctx: zmq.asyncio.Context, endpoint: str, replay_endpoint: str | None, stream: Stream
) -> asyncio.Task[None]:
    return asyncio.create_task(follow(ctx, endpoint, replay_endpoint, stream), name=f"kv-events {endpoint}")
