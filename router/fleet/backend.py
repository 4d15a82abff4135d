"""A backend: one vLLM server of a pool, known by its origin, with the counts admission and
balancing read (in flight, prefilling), its health and its upstream connections. Its `Health` is
what its probes last judged (router/fleet/health.py): one that is not DOWN takes requests
(`routable`). A backend outlives a reload whenever its pool keeps it (router/state/runtime.py);
the pool that holds it is router/fleet/pool.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Final

from mypy_extensions import mypyc_attr

from router.balance import corrected_load
from router.config.models import PoolConfig
from router.proxy.upstream import UpstreamPool
from router.tls.upstream import UpstreamTls


class Health(Enum):
    UNKNOWN = "unknown"
    UP = "up"
    DOWN = "down"


def backend_label(pool: str, index: int) -> str:
    """How messages that clients may see name a backend: by its pool and its number in the pool,
    never by its address. Numbers are given on first sight and never reused within a pool: a
    listed pool's backends get 0, 1, … in list order when the pool is first built, later ones
    (a reload adding an origin, an address discovery finds) the next free number."""
    return f"pool {pool!r} backend {index}"


# Python classes even where this module is compiled: the interpreted fleet, discovery and lab
# build them and read them by name.
@mypyc_attr(native_class=False)
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


@mypyc_attr(native_class=False)
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
    live_max_model_len: int | None = None  # what the server's /v1/models states for the pool's model
    # Every model id its last usable /v1/models listed (None: none answered yet), and the LoRA
    # adapters among them with their parents (router/fleet/adapters.py). Replaced whole, never
    # changed in place: a request reads them without a lock.
    served: frozenset[str] | None = None
    adapters: tuple[tuple[str, str], ...] = ()
    loading: frozenset[str] = frozenset()  # adapters the router is loading on it (adapterload.py)
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


_DOWN: Final = Health.DOWN


def routable(backends: Sequence[Backend], exclude: frozenset[Backend]) -> list[Backend]:
    """The backends that take requests (not DOWN), but those in `exclude`."""
    if not exclude:
        return [b for b in backends if b.health is not _DOWN]
    return [b for b in backends if b.health is not _DOWN and b not in exclude]
