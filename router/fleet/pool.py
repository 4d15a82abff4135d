"""A pool: its backends, in three sets. `backends` are the members in rotation (health decides
which of them are routable); `joining`, servers found by discovery and not yet probed healthy;
`draining`, servers gone from the pool that still finish their requests. How members come and go
is router/fleet/fleet.py; a pool outlives a reload whenever the profile keeps it
(router/state/runtime.py), and so does the gate its lanes wait at (router/lanes/poolgate.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from router.config.models import PoolConfig
from router.fleet.backend import Backend, ConnectionSettings, Health, backend_label, routable
from router.fleet.kvcaches import KVCaches
from router.fleet.membership import DiscoveryStatus
from router.lanes.poolgate import PoolGate
from router.tls.upstream import UpstreamTls


@dataclass(eq=False)
class Pool:
    name: str
    config: PoolConfig
    upstream_key: bytes | None
    config_hash: str
    backends: tuple[Backend, ...] = ()
    joining: tuple[Backend, ...] = ()
    draining: tuple[Backend, ...] = ()
    next_index: int = 0
    discovery: DiscoveryStatus = field(default_factory=DiscoveryStatus)
    holders: int = 0  # runtimes that hold the pool (router/fleet/fleet.py)
    tls: UpstreamTls | None = None  # towards https backends (router/tls/upstream.py)
    live_max_model_len: int | None = None  # the shortest its servers state (router/fleet/health.py)
    gate: PoolGate = field(init=False)  # built with the pool (router/state/runtime.py `_new_pool`)
    # The health checker's schedule (router/fleet/health.py `note_schedule`): when it probes
    # next (monotonic; < 0: not known), every how long, and how many healthy probes a backend
    # that is down needs to be routable again.
    next_round_at: float = -1.0
    round_s: float = 5.0
    rounds_to_rejoin: int = 1
    # What its engines' KV events say they hold, for `precise_prefix` lanes (router/fleet/kvcaches.py).
    kv: KVCaches = field(default_factory=KVCaches)

    def routable(self, exclude: frozenset[Backend] = frozenset()) -> list[Backend]:
        return routable(self.backends, exclude)

    @property
    def max_model_len(self) -> int:
        """The context requests are judged against: the profile's, or the servers' when shorter."""
        declared = self.config.vllm.max_model_len
        live = self.live_max_model_len
        return declared if live is None else min(declared, live)

    def back_in_s(self, now: float) -> float:
        """Seconds until a backend down now could be routable again, at the earliest: the
        next health round, and a round more for each further healthy probe it needs."""
        at = self.next_round_at
        first = self.round_s if at < 0.0 else max(0.0, at - now)
        return first + (self.rounds_to_rejoin - 1) * self.round_s

    def has_healthy_backend(self) -> bool:
        return any(b.health is Health.UP for b in self.backends)

    @property
    def members(self) -> tuple[Backend, ...]:
        """Every backend the pool has now: in rotation or joining it."""
        return self.backends + self.joining

    def new_backend(self, origin: str) -> Backend:
        """A backend first seen now, with the pool's next number and its own connections."""
        index = self.next_index
        self.next_index += 1
        settings = ConnectionSettings.of(self.config, self.tls)
        upstream = settings.connect(origin, backend_label(self.name, index))
        return Backend(pool=self.name, name=origin, upstream=upstream, index=index, connection=settings)

    def wake_waiters(self) -> None:
        """Offer room to queued requests now — after a limit rose or a backend joined — rather
        than at the next release."""
        self.gate.wake()
