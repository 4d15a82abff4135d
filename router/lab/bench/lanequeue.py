"""A lane's admission on the virtual clock: `max_in_flight` slots, and the waiters ordered by the
router's own queue.

The order is not modelled: waiters are `router.lanes.fairqueue.Waiter`s in the router's `Band`s
(by lane `priority`, then key `tier`, start-time fair across keys by `weight`), a full lane
makes room with the router's `most_held`, and a slot is offered as `PoolGate._grant` offers
it — in band order, past waiters whose lane is full. What is left out: the per-backend prefill
limits (a request granted a lane slot goes to a backend at once) and the drain-rate Retry-After.
A waiter past its lane's `queue_timeout_s` is refused (503) at the next event of the run, when
the router would have refused it at its deadline: its outcome is the same, only its time of
refusal is later.

`cost` is what `Band.add` is given per request: 1 (the router's choice, by requests) or its
prompt and output tokens (by tokens), to measure one against the other.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import deque
from dataclasses import dataclass
from typing import Literal

from router.balance import Affinity
from router.fleet.backend import Backend
from router.keys.tenant import Tenant
from router.lanes.admission import lane_has_room
from router.lanes.fairqueue import Band, Waiter, band_of
from router.lanes.lane import Lane
from router.lanes.poolgate import Ticket, most_held

Cost = Literal["requests", "tokens"]
Verdict = Literal["go", "wait", "refused"]


@dataclass(slots=True)
class Held:
    """A request that holds or waits for a lane slot."""

    request_id: str
    ticket: Ticket
    deadline: float
    waiter: Waiter | None = None


class VirtualGate:
    """The lanes of one virtual router: which requests go, which wait, which are refused."""

    def __init__(self, cost: Cost = "requests") -> None:
        self.cost = cost
        # Waiters hold futures, as in the router; this loop never runs, it only makes them.
        self._loop = asyncio.new_event_loop()
        self._bands: dict[tuple[str, tuple[int, int]], Band] = {}  # per pool, the router's bands
        self._order: list[tuple[str, tuple[int, int]]] = []
        self._places: dict[int, dict[str, deque[Waiter]]] = {}  # per lane, each key's waiters
        self._held: dict[str, Held] = {}
        self._of_waiter: dict[int, Held] = {}
        self.refused: list[str] = []  # waiters refused since the caller last took them

    def close(self) -> None:
        self._loop.close()

    def arrive(
        self, request_id: str, lane: Lane, tenant: Tenant, tokens: int, affinity: Affinity, now: float
    ) -> Verdict:
        """A request for `lane`: it takes a slot now, waits for one, or is refused (queue full)."""
        self.expire(now)
        ticket = Ticket(lane, False, affinity)
        ticket.tenant = tenant
        held = Held(request_id, ticket, now + lane.config.queue_timeout_s)
        if not self._waiting_in(lane) and lane_has_room(lane.in_flight, lane.config.max_in_flight):
            self._take(held)
            return "go"
        if lane.waiting >= lane.config.queue_limit and not self._make_room(ticket):
            return "refused"
        self._enqueue(held, 1.0 if self.cost == "requests" else float(tokens))
        self._grant()
        return "go" if held.waiter is None else "wait"

    def holds(self, request_id: str) -> bool:
        """Whether the request holds a lane slot (its backend not yet chosen, or chosen)."""
        held = self._held.get(request_id)
        return held is not None and held.ticket.holds_lane

    def affinity(self, request_id: str) -> Affinity:
        return self._held[request_id].ticket.affinity

    def finished(self, request_id: str, now: float) -> list[str]:
        """The request is done: its slot goes to the waiters; the ids of those granted one."""
        held = self._held.pop(request_id, None)
        if held is not None and held.ticket.holds_lane:
            held.ticket.holds_lane = False
            held.ticket.lane.in_flight -= 1
        self.expire(now)
        return self._grant()

    def expire(self, now: float) -> None:
        """Refuse the waiters past their deadline."""
        for band in self._bands.values():
            late = [w for w in band.waiters if self._of_waiter[id(w)].deadline <= now]
            if late:
                for waiter in late:
                    self._refuse(waiter)
                band.keep([w for w in band.waiters if not w.future.done()])

    # -- the router's queue ---------------------------------------------------------------------

    def _waiting_in(self, lane: Lane) -> bool:
        return bool(self._places.get(id(lane)))

    def _take(self, held: Held) -> None:
        held.ticket.holds_lane = True
        held.ticket.lane.in_flight += 1
        self._held[held.request_id] = held

    def _enqueue(self, held: Held, cost: float) -> None:
        ticket = held.ticket
        place = (ticket.lane.pool.name, band_of(ticket.lane.config.priority, ticket.tenant))
        band = self._bands.get(place)
        if band is None:
            band = self._bands[place] = Band()
            bisect.insort(self._order, place)
        future: asyncio.Future[Backend] = self._loop.create_future()
        waiter = Waiter(ticket, future, band)
        band.add(waiter, ticket.tenant, cost)
        held.waiter = waiter
        self._held[held.request_id] = held
        self._of_waiter[id(waiter)] = held
        self._places.setdefault(id(ticket.lane), {}).setdefault(ticket.tenant.name, deque()).append(waiter)
        ticket.lane.waiting += 1

    def _left(self, waiter: Waiter) -> Held:
        held = self._of_waiter.pop(id(waiter))
        lane = waiter.ticket.lane
        lane.waiting -= 1
        places = self._places[id(lane)]
        name = waiter.ticket.tenant.name
        places[name].remove(waiter)
        if not places[name]:
            del places[name]
        held.waiter = None
        return held

    def _refuse(self, waiter: Waiter) -> None:
        held = self._left(waiter)
        waiter.future.cancel()
        del self._held[held.request_id]
        self.refused.append(held.request_id)

    def _make_room(self, ticket: Ticket) -> bool:
        places = self._places.get(id(ticket.lane))
        if not places:
            return False
        mine = places.get(ticket.tenant.name)
        need = ((len(mine) if mine is not None else 0) + 1) / ticket.tenant.weight
        victim = most_held(places, need)
        if victim is None:
            return False
        self._refuse(victim)
        victim.band.keep([w for w in victim.band.waiters if w is not victim])
        return True

    def _grant(self) -> list[str]:
        """Offer free lane slots to the waiters in band order; the ids of those that got one."""
        granted: list[str] = []
        full: set[int] = set()
        for place in self._order:
            band = self._bands[place]
            kept: list[Waiter] = []
            for waiter in band.waiters:
                lane = waiter.ticket.lane
                if id(lane) in full or not lane_has_room(lane.in_flight, lane.config.max_in_flight):
                    full.add(id(lane))
                    kept.append(waiter)
                    continue
                held = self._left(waiter)
                band.served(waiter)
                waiter.future.cancel()  # served: `most_held` passes it by
                self._take(held)
                granted.append(held.request_id)
            band.keep(kept)
        return granted
