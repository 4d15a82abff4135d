"""A request's claim on its pool (`Ticket`), and what the pool's gate reads of the request's lane
(`GatedLane`): the gate (router/lanes/poolgate.py) and the queue's order
(router/lanes/fairqueue.py) name the lane by what they read of it, so neither imports the lane
(router/lanes/lane.py), whose pool holds the gate."""

from __future__ import annotations

import asyncio
from typing import Protocol

from router.balance import Affinity, Balancer
from router.config.models import LaneConfig
from router.fleet.adapters import AdapterNeed
from router.fleet.backend import Backend
from router.keys.tenant import ANONYMOUS, Tenant
from router.lanes.drain import Drain
from router.lanes.settings import LaneSettings
from router.observe.metrics import LaneQueueMetrics


class Named(Protocol):
    @property
    def name(self) -> str: ...


class GatedLane(Protocol):
    """What a gate reads and counts of a lane (router/lanes/lane.py `Lane`)."""

    in_flight: int
    waiting: int

    @property
    def name(self) -> str: ...
    @property
    def config(self) -> LaneConfig: ...
    @property
    def settings(self) -> LaneSettings: ...
    @property
    def balancer(self) -> Balancer: ...
    @property
    def pool(self) -> Named: ...
    @property
    def drain(self) -> Drain: ...
    @property
    def held(self) -> dict[str, int]: ...
    @property
    def queue_metrics(self) -> LaneQueueMetrics: ...


class Ticket:
    """One request's claim on its pool, and what it holds right now. A plain slotted class, not
    a dataclass: one is built per request; compared by identity."""

    __slots__ = (
        "adapter",
        "affinity",
        "backend",
        "holds_lane",
        "lane",
        "long",
        "pin",
        "prefilling",
        "tenant",
        "timer",
        "tokens",
        "tried",
    )

    def __init__(
        self,
        lane: GatedLane,
        long: bool,
        affinity: Affinity,
        pin: Backend | None = None,
        tried: frozenset[Backend] = frozenset(),
    ) -> None:
        self.lane = lane
        self.long = long
        self.affinity = affinity
        self.tried = tried  # backends this request was sent to
        self.holds_lane = False
        self.backend: Backend | None = None
        self.prefilling = False
        self.timer: asyncio.TimerHandle | None = None
        self.pin = pin  # the one backend the request may go to (a stored response's)
        # The LoRA adapter the request names: only its holders may take it (`for_adapter`).
        self.adapter: AdapterNeed | None = None
        self.tenant: Tenant = ANONYMOUS  # its key, as the queue orders it
        # Its prompt and output bound: its turn's cost in a lane that counts turns in tokens.
        self.tokens = 1

    def for_adapter(self, need: AdapterNeed) -> None:
        """Send the request only to the adapter's holders, placed by its name
        (router/balance/adapter_placement.py) whatever the lane's strategy."""
        self.adapter = need
        self.affinity = need.key
