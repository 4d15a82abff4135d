"""The engines' KV events, fed into the router's view of their caches on the virtual clock.

Each simulated engine's events of a step become one batch as vLLM publishes it (sequence numbered
from 0 per engine life, the block hashes in vLLM's published form) and reach the pool's
`KVCaches` — the same `Stream` per backend name the router follows over ZMQ
(router/fleet/kvstream.py) — `delay` seconds of virtual time after the step ended. Batches are
applied lazily: `advance(now)` before each placement applies those due by then. A backend that
joins gets a new stream (its engine starts empty, its sequence from 0), connected `connect`
seconds later, the batches published meanwhile then applied as a replay would; one that leaves is
no longer followed and its pending batches are dropped.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

from router.fleet import kvevents as wire
from router.fleet.kvcaches import KVCaches
from router.fleet.kvstream import Stream
from router.lab.sim import kv_events as sim
from router.lab.sim.vclock import Membership

DEFAULT_DELAY_S = 0.005  # a PUB socket on the same host network: a few milliseconds
# From a backend's joining the pool to the router's subscriber connecting to its publisher; until
# then the router places on that backend by approximation (its history comes in by replay).
DEFAULT_CONNECT_S = 0.5


def batch_of(seq: int, ts: float, events: Sequence[sim.KVEvent]) -> wire.EventBatch:
    """The simulator's events as the router decodes vLLM's batch (router/fleet/kvevents.py)."""
    return wire.EventBatch(seq, ts, tuple(_event(e) for e in events), 0)


def _event(event: sim.KVEvent) -> wire.KVEvent:
    if isinstance(event, sim.BlockStored):
        return wire.BlockStored(
            block_hashes=tuple(sim.external_hash(d) for d in event.digests),
            parent_block_hash=None if event.parent is None else sim.external_hash(event.parent),
            token_ids=tuple(event.token_ids),
            block_size=event.block_size,
            plain=True,
        )
    if isinstance(event, sim.BlockRemoved):
        return wire.BlockRemoved((sim.external_hash(event.digest),), plain=True)
    return wire.AllBlocksCleared()


class KVFeed(Membership):
    """The engines at `names` (by backend index) publishing into their pools' views `caches` (one
    per backend), each batch arriving `delay` seconds after its step."""

    def __init__(
        self,
        names: Sequence[str],
        caches: Sequence[KVCaches],
        delay: float = DEFAULT_DELAY_S,
        connect: float = DEFAULT_CONNECT_S,
    ) -> None:
        if delay < 0 or connect < 0:
            raise ValueError("delays cannot be negative")
        if len(caches) != len(names):
            raise ValueError("one view per backend")
        self.names = list(names)
        self.caches = list(caches)
        self.delay = delay
        self.connect = connect
        self._connecting: dict[int, float] = {}  # backend index → when its subscriber connects
        self._seq = [0] * len(names)
        self._pending: list[tuple[float, int, int, wire.EventBatch]] = []  # a heap, by arrival
        self._order = itertools.count()
        self.batches = 0

    def published(self, index: int, events: list[sim.KVEvent], at: float) -> None:
        batch = batch_of(self._seq[index], at, events)
        self._seq[index] += 1
        # A step is reported when it starts (its end is known then): order by arrival at the router.
        heapq.heappush(self._pending, (at + self.delay, next(self._order), index, batch))
        self.batches += 1

    def joined(self, index: int, at: float) -> None:
        self._drop(index)
        self._seq[index] = 0
        # The fleet's first engines are followed from the start.
        wait = self.connect if at > 0 else 0.0
        self.caches[index].streams[self.names[index]] = Stream(
            self.caches[index].index(), connected=wait == 0
        )
        if wait:
            self._connecting[index] = at + wait

    def left(self, index: int, at: float) -> None:
        self._drop(index)
        self._connecting.pop(index, None)
        self.caches[index].streams.pop(self.names[index], None)

    def advance(self, now: float) -> None:
        """Apply every batch that has reached the router by `now`."""
        for index, at in list(self._connecting.items()):
            if at <= now:
                del self._connecting[index]
                self.caches[index].streams[self.names[index]].connected = True
        pending = self._pending
        while pending and pending[0][0] <= now:
            due, _, index, batch = heapq.heappop(pending)
            stream = self.caches[index].streams.get(self.names[index])
            if stream is not None:
                # In order and without loss, as a healthy SUB socket delivers them.
                stream.live(batch, due)

    def _drop(self, index: int) -> None:
        self._pending = [p for p in self._pending if p[2] != index]
        heapq.heapify(self._pending)
