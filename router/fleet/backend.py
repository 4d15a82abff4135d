"""A pool and its backends: the long-lived objects that hold what is true of the servers.

A `Backend` is one vLLM server of a pool, known by its origin, with the counts admission and
balancing read (in flight, prefilling), its health and its upstream connections. A `Pool` holds
its backends in three sets: `backends`, the members in rotation (health decides which of them
are routable); `joining`, servers found by discovery and not yet probed healthy; `draining`,
servers gone from the pool that still finish their requests. How members come and go is
router/fleet/fleet.py; these objects outlive a reload whenever the pool and backend stay
(router/state/runtime.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from router.balance import corrected_load
from router.config.models import PoolConfig
from router.fleet.backendhealth import Health
from router.fleet.membership import DiscoveryStatus
from router.lanes.poolgate import PoolGate, routable
from router.proxy.upstream import UpstreamPool
from router.tls.upstream import UpstreamTls


def backend_label(pool: str, index: int) -> str:
    """How messages that clients may see name a backend: by its pool and its number in the pool,
    never by its address. Numbers are given on first sight and never reused within a pool: a
    listed pool's backends get 0, 1, … in list order when the pool is first built, later ones
    (a reload adding an origin, an address discovery finds) the next free number."""
    return f"pool {pool!r} backend {index}"


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    """The settings an upstream connection pool is built with; a reload that changes them gives
    a backend a new one (and drains the old)."""

    max_connections: int
    connect_timeout: float
    read_timeout: float
    head_timeout: float
    head_read_timeout: float
    idle_expiry: float
    tls: UpstreamTls | None = None  # equal while the pool's tls: block and its files are

    @classmethod
    def of(cls, pc: PoolConfig, tls: UpstreamTls | None = None) -> ConnectionSettings:
        return cls(
            max_connections=pc.max_connections,
            connect_timeout=pc.connect_timeout_s,
            read_timeout=pc.read_timeout_s,
            head_timeout=pc.response_head_timeout_s,
            head_read_timeout=pc.head_read_timeout_s,
            idle_expiry=pc.upstream_keepalive_s,
            tls=tls,
        )

    def connect(self, origin: str, label: str) -> UpstreamPool:
        return UpstreamPool(
            origin,
            max_connections=self.max_connections,
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            head_timeout=self.head_timeout,
            head_read_timeout=self.head_read_timeout,
            idle_expiry=self.idle_expiry,
            label=label,
            ssl_context=self.tls.context if self.tls is not None else None,
            server_hostname=self.tls.server_name if self.tls is not None else None,
        )


@dataclass(eq=False)
class Backend:
    """One vLLM server of a pool, with the live counters balancing and health read. `name` is
    its origin, for logs and metric labels; `label` names it to clients."""

    pool: str
    name: str
    upstream: UpstreamPool
    index: int = 0
    connection: ConnectionSettings | None = None  # what `upstream` was built with
    health: Health = Health.UNKNOWN
    in_flight: int = 0
    prefilling: int = 0
    long_prefilling: int = 0
    consecutive_failures: int = 0
    consecutive_successes: int = 0
    # The last scrape of the backend's own /metrics (router.fleet.scrape), and this router's in-flight
    # count at that moment, so the sample can be corrected until the next one.
    scraped: bool = False
    scraped_running: float = 0.0
    scraped_waiting: float = 0.0
    scraped_kv_usage: float = 0.0
    in_flight_at_scrape: int = 0
    drift: tuple[str, ...] = ()
    auth_failure_logged_at: float | None = None  # monotonic time of the last such warning

    @property
    def label(self) -> str:
        return backend_label(self.pool, self.index)

    @property
    def routable(self) -> bool:
        return self.health is not Health.DOWN

    @property
    def idle(self) -> bool:
        """No request holds it or its connections: it can be closed without cutting one."""
        return self.in_flight == 0 and upstream_idle(self.upstream)

    @property
    def load_score(self) -> float:
        return corrected_load(
            self.in_flight,
            self.in_flight_at_scrape,
            self.scraped_running,
            self.scraped_waiting,
            self.scraped_kv_usage,
            self.scraped,
        )


def upstream_idle(upstream: UpstreamPool) -> bool:
    stats = upstream.stats()
    return stats.in_use == 0 and stats.connecting == 0 and stats.waiting == 0


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
    gate: PoolGate = field(init=False)  # built with the pool (router/state/runtime.py `_new_pool`)

    def routable(self, exclude: frozenset[Backend] = frozenset()) -> list[Backend]:
        return routable(self.backends, exclude)

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
