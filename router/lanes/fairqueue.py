"""The order in which a pool's waiters are offered room: fair across keys.

A pool's queue is split into bands: lanes of a lower `priority` first, then keys of a higher
`tier` first. Within a band the waiters are ordered by start-time fair queueing, counted in
requests: a key's request is tagged, when it starts waiting, with a virtual finish time — its
start (the later of the band's clock and the key's previous finish) plus 1 / the key's weight —
and the band serves the smallest tag first (the earliest to wait among equal tags). The clock
is the start tag of the request last served. So a key that has waited longest is not the one
served next unless its turn has come: a quiet key's first request goes before the second
request of a key with many waiting, and keys that all keep waiters share the band in the ratio
of their weights. One key's waiters keep their order: alone, a band is FIFO. A key new to the
band starts after the slots of the lane it holds already (taken while nobody waited, untagged):
the first slot a flood frees goes to a key holding none.

A request's cost is 1 by default; a lane with `fair_by: tokens` charges its prompt and output
bound (`Band.add` takes the cost). Measured on two keys kept waiting on 2 slots, each request
holding its slot as long as its tokens (tests/lanes/test_fairqueue.py): with equal sizes both
costs give the same shares; when one key's requests are 10 times longer, counting requests
shares the requests by weight and the slots' time 10:1, counting tokens shares the time by
weight and the requests 1:10. Requests are the default: a waiting request's output length is
unknown when it is ordered (its bound, `max_tokens` or the context, charges a key for what it
might ask and favours clients that set a low bound), a lane's slot is what the queue hands out,
and a key's tokens are already capped by its `tpm`. Where one tenant's answers are many times
longer than the others', the lab finds tokens right (docs/lab.md)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Final

from router.fleet.backend import Backend
from router.keys.tenant import Tenant
from router.lanes.ticket import GatedLane, Ticket

# Past this many keys remembered, a band forgets those whose turn has come anyway.
_REMEMBERED: Final = 1024


@dataclass(eq=False, slots=True)
class Waiter:
    ticket: Ticket
    future: asyncio.Future[Backend]
    band: Band
    start: float = 0.0  # virtual start and finish, in the band's clock
    finish: float = 0.0
    counted: bool = True  # still counted in `waiting` (the future may be cancelled before that ends)


class Band:
    """The waiters of one (lane priority, key tier), in the order they are to be offered room."""

    __slots__ = ("clock", "finish_of", "waiters")

    def __init__(self) -> None:
        self.waiters: list[Waiter] = []
        self.clock = 0.0
        self.finish_of: dict[str, float] = {}

    def add(self, waiter: Waiter, tenant: Tenant, cost: float = 1.0, held: float = 0.0) -> None:
        """Tag the waiter and place it after every waiter of a tag as small. `held`: the turns of
        the key's requests holding a slot of the waiter's lane (their count, times `cost` where
        turns are tokens). A key new to the band starts after them,
        as if they had been tagged: they took their slots untagged while nobody waited (or
        were tagged before the band last emptied), and a key holding slots must not tie with
        one that holds none."""
        start = self.start_of(tenant, held)
        finish = start + cost / tenant.weight
        self.finish_of[tenant.name] = finish
        waiter.start = start
        waiter.finish = finish
        waiters = self.waiters
        lo, hi = 0, len(waiters)
        while lo < hi:
            mid = (lo + hi) // 2
            if waiters[mid].finish <= finish:
                lo = mid + 1
            else:
                hi = mid
        waiters.insert(lo, waiter)

    def start_of(self, tenant: Tenant, held: float) -> float:
        """The virtual start the key's next waiter would be tagged with."""
        last = self.finish_of.get(tenant.name)
        return self.clock + held / tenant.weight if last is None else max(self.clock, last)

    def ahead(self, lane: GatedLane, finish: float, waiter: Waiter | None = None) -> int:
        """The lane's waiters still waiting that this band offers room before `waiter`, or
        before a waiter tagged `finish` were it added now."""
        count = 0
        for other in self.waiters:
            if other is waiter or other.finish > finish:
                break
            if other.ticket.lane is lane and not other.future.done():
                count += 1
        return count

    def count(self, lane: GatedLane) -> int:
        """The lane's waiters in this band still waiting."""
        return sum(1 for w in self.waiters if w.ticket.lane is lane and not w.future.done())

    def served(self, waiter: Waiter) -> None:
        """The waiter was given room: the band's clock moves to its start."""
        if waiter.start > self.clock:
            self.clock = waiter.start

    def keep(self, waiters: list[Waiter]) -> None:
        """What is left waiting after a pass, in order. An empty band starts afresh; a band that
        remembers many keys forgets those whose previous finish is behind the clock (their
        next start is the clock either way)."""
        self.waiters = waiters
        if not waiters:
            self.clock = 0.0
            self.finish_of.clear()
        elif len(self.finish_of) > _REMEMBERED:
            clock = self.clock
            self.finish_of = {k: f for k, f in self.finish_of.items() if f > clock}


def band_of(priority: int, tenant: Tenant) -> tuple[int, int]:
    """A band's place: lower lane priority first, then higher key tier."""
    return (priority, -tenant.tier)
