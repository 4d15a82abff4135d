"""A process's share of each limit, when several processes enforce it without shared state.

N router processes that each enforce a whole limit admit N times it. A process that knows it is
one of N — worker i of `lane-router serve --workers N`, or one of `replicas: N` identical routers
behind a load balancer — enforces its part instead: worker i of N gets `limit // N`, plus one
when i < `limit % N`, so the workers' parts sum exactly to the limit; replicas have no index, so
each gets `limit // R`, which its workers split again. With shared state (`state:`) the parts are
what a process falls back to while Redis cannot be reached (router/state/slots/store.py).

A part may be 0: such a process admits no request that needs the slot (a lane with no in-flight
slot, a pool with no long-prefill slot for long prompts), and `lane-router check` warns of it."""

from __future__ import annotations

from dataclasses import dataclass

from router.config.lanemap import lane_plan
from router.config.models import ProfileConfig


def split(limit: int, parts: int, index: int) -> int:
    """Part `index` of `limit` shared by `parts`: the parts of 0..parts-1 sum to `limit`."""
    return limit // parts + (1 if index < limit % parts else 0)


@dataclass(frozen=True, slots=True)
class Share:
    """Which process this is among those enforcing the same limits."""

    workers: int = 1
    index: int = 0
    replicas: int = 1

    def __post_init__(self) -> None:
        if self.workers < 1 or self.replicas < 1 or not 0 <= self.index < self.workers:
            raise ValueError(f"no worker {self.index} of {self.workers} (replicas {self.replicas})")

    @property
    def processes(self) -> int:
        return self.workers * self.replicas

    @property
    def alone(self) -> bool:
        return self.processes == 1

    def part(self, limit: int) -> int:
        """This process's part of `limit`."""
        return split(limit // self.replicas, self.workers, self.index)

    def of(self, limit: int | None) -> int | None:
        """This process's part of `limit` (None: unlimited, for every process)."""
        return None if limit is None else self.part(limit)

    def with_replicas(self, replicas: int) -> Share:
        return Share(self.workers, self.index, replicas)


ALONE = Share()


def prefill_parts(
    share: Share, max_prefilling: int | None, max_long_prefilling: int | None
) -> tuple[int | None, int | None]:
    """A process's parts of a pool's per-backend prefill limits. The long part stays below the
    whole part, as the profile's limits must (so a short prompt always finds room), even where
    that leaves the parts of the long limit summing to less than it."""
    whole, long = share.of(max_prefilling), share.of(max_long_prefilling)
    if whole is not None and long is not None:
        long = max(0, min(long, whole - 1))
    return whole, long


@dataclass(frozen=True, slots=True)
class Budget:
    """One limit of the profile and each process's part of it."""

    path: str  # the dotted path of the limit in the profile
    limit: int
    parts: tuple[int, ...]  # one per worker (a replica's workers when `replicas` > 1)


def budgets(cfg: ProfileConfig, workers: int) -> list[Budget]:
    """Every limit the processes of `cfg` split, with each worker's part (per replica when the
    profile says it runs as several)."""
    shares = [Share(workers, i, cfg.replicas) for i in range(workers)]
    out: list[Budget] = []
    for planned in lane_plan(cfg):
        lane = planned.config
        if lane.max_in_flight is not None:
            parts = tuple(s.of(lane.max_in_flight) or 0 for s in shares)
            out.append(Budget(f"{planned.path}.max_in_flight", lane.max_in_flight, parts))
    for name, pool in cfg.pools.items():
        adm = pool.admission
        prefill = [prefill_parts(s, adm.max_prefilling, adm.max_long_prefilling) for s in shares]
        if adm.max_prefilling is not None:
            parts = tuple(whole or 0 for whole, _ in prefill)
            out.append(Budget(f"pools.{name}.admission.max_prefilling", adm.max_prefilling, parts))
        if adm.max_long_prefilling is not None:
            parts = tuple(long or 0 for _, long in prefill)
            out.append(Budget(f"pools.{name}.admission.max_long_prefilling", adm.max_long_prefilling, parts))
    return out
