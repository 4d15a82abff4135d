"""Admission to one pool, with waiting: the I/O edge of `router.lanes.admission`.

A request holds a `Ticket` from admission to its end. Taking a slot counts it against its lane
(`max_in_flight`) and against one backend (in flight, and prefilling until its first token).
When no slot is free the request waits in the pool's queue: lanes in priority order (lower
`priority` first), then keys by tier, fair across keys within that (router/lanes/fairqueue.py;
FIFO for one key), each lane's queue bounded by `queue_limit` and each wait by
`queue_timeout_s` (then 503 with Retry-After). A key arriving at a full lane takes the newest
place of the key holding the most of it for its weight, when that is more than its own would be
(`_make_room`): a flood fills an idle queue but cannot keep another key out of it.

A released slot is handed to a waiter directly (the waiter's future receives its backend), so a
request arriving later cannot take it first. A pass over the queue skips, at O(1) each, waiters
that cannot go for a reason already seen: a long prompt blocked by the long-prefill limit does
not hold up the short prompts behind it.

The common case — nobody waiting and a slot free — costs no future, no task and no timer.

The counts are this process's own. A process that is one of several enforces its part of every
limit (router/state/slots/budget.py); with shared state, `router.state.slots.gate.SharedPoolGate` checks the
whole limits in Redis and falls back to these parts while Redis cannot be reached."""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import deque
from typing import Final, Protocol

from mypy_extensions import mypyc_attr

from router.balance.adapter_placement import ADAPTER_PLACEMENT
from router.errors import Unavailable
from router.fleet.adapters import candidates_for
from router.fleet.backend import Backend, Health, routable
from router.lanes.admission import PrefillLimits, choose_backend, lane_has_room
from router.lanes.drain import bounded_s, retry_after_s
from router.lanes.fairqueue import Band, Waiter, band_of
from router.lanes.ticket import GatedLane
from router.lanes.ticket import Ticket as Ticket  # where the proxy and the shared gate import it
from router.state.slots.budget import ALONE, Share

_SCAN_LIMIT: Final = 256  # waiters looked at per pass, so one release never costs more than this


_Waiter = Waiter  # the name router/state/slots/gate.py imports


class Members(Protocol):
    """What a gate reads of its pool (router/fleet/backend.py `Pool`): the backends in rotation."""

    @property
    def backends(self) -> tuple[Backend, ...]: ...

    def back_in_s(self, now: float) -> float:
        """Seconds until a backend down now could be in rotation again, at the earliest."""
        ...


# Subclassed by the gate that counts in Redis (router/state/slots/gate.py), which is not compiled
# (docs/compiled.md).
@mypyc_attr(allow_interpreted_subclasses=True)
class PoolGate:
    """`limits` are the pool's; the gate enforces `share`'s part of them (and of its lanes'
    `max_in_flight`), which are the limits themselves for a process alone."""

    def __init__(
        self,
        limits: PrefillLimits,
        pool: Members,
        share: Share = ALONE,
    ) -> None:
        self._pool = pool
        self._queues: dict[tuple[int, int], Band] = {}
        self._priorities: list[tuple[int, int]] = []  # the bands, in order
        # Each lane's waiters by key, oldest first: what a lane's `queue_limit` is shared by.
        self._places: dict[int, dict[str, deque[Waiter]]] = {}
        self.waiting = 0
        self.share = share
        self.configure(limits)

    def configure(self, limits: PrefillLimits, share: Share | None = None) -> None:
        """New limits (a reload), applied to the next admissions."""
        if share is not None:
            self.share = share
        self.whole = limits
        self.limits = limits.part(self.share)
        self._split = not self.share.alone

    def lane_limit(self, lane: GatedLane) -> int | None:
        """This process's part of the lane's `max_in_flight`."""
        limit = lane.config.max_in_flight
        return self.share.of(limit) if self._split else limit

    # -- taking and giving back -------------------------------------------------------------

    def try_take(self, ticket: Ticket) -> Backend | None:
        lane = ticket.lane
        if not ticket.holds_lane:
            limit = lane.settings.max_in_flight
            if limit is not None:
                if self._split:
                    limit = self.share.part(limit)
                if lane.in_flight >= limit:
                    return None
        # Most tickets are pinned to no backend: the routable ones are theirs.
        pool = self._pool
        if ticket.pin is None and ticket.adapter is None:
            candidates = routable(pool.backends, ticket.tried)
            balancer = lane.balancer
        else:
            candidates = routable_for(pool, ticket)
            balancer = lane.balancer if ticket.adapter is None else ADAPTER_PLACEMENT
        backend = choose_backend(candidates, self.limits, ticket.long, balancer, ticket.affinity)
        if backend is None:
            return None
        charge(ticket, backend)
        return backend

    def end_prefill(self, ticket: Ticket) -> None:
        """The request's first token arrived (or it stopped waiting for one)."""
        if not ticket.prefilling:
            return
        ticket.prefilling = False
        if ticket.timer is not None:
            ticket.timer.cancel()
            ticket.timer = None
        backend = ticket.backend
        assert backend is not None
        backend.prefilling -= 1
        if ticket.long:
            backend.long_prefilling -= 1
        if self.waiting:
            self._grant()

    def end_attempt(self, ticket: Ticket) -> None:
        """The request is done with its backend (finished, failed, or moving to another)."""
        backend = ticket.backend
        if backend is None:
            return
        if ticket.prefilling:
            self.end_prefill(ticket)
        ticket.backend = None
        backend.in_flight -= 1
        if self.waiting:
            self._grant()

    def retry_elsewhere(self, ticket: Ticket) -> None:
        """The attempt failed before any byte: give its backend back and never try it again."""
        backend = ticket.backend
        if backend is not None:
            ticket.tried |= {backend}
            self.end_attempt(ticket)

    def finish(self, ticket: Ticket) -> None:
        """Give back everything the ticket holds."""
        self.end_attempt(ticket)
        if ticket.holds_lane:
            ticket.holds_lane = False
            lane = ticket.lane
            lane.in_flight -= 1
            held = lane.held
            name = ticket.tenant.name
            left = held[name] - 1
            if left:
                held[name] = left
            else:
                del held[name]
            if lane.waiting:
                lane.drain.completed(time.monotonic())
            else:
                lane.drain.idle()
            if self.waiting:
                self._grant()

    # -- waiting ----------------------------------------------------------------------------

    async def acquire(self, ticket: Ticket) -> Backend:
        """A backend for the ticket, waiting in the queue when no slot is free now."""
        if not self.waiting:
            backend = self.try_take(ticket)
            if backend is not None:
                return backend
        self.refuse_hopeless(ticket, self.limits, self.lane_limit(ticket.lane))
        return await self.wait(ticket)

    def refuse_hopeless(self, ticket: Ticket, limits: PrefillLimits, lane_limit: int | None) -> None:
        """Raise `Unavailable` when waiting cannot help: the pool takes no such prompt (through
        this process), no backend is routable, or the lane's queue is full."""
        lane = ticket.lane
        if limits.refuses(ticket.long) or lane_limit == 0:
            raise _refused(ticket, self.whole, limits, lane_limit)
        if not routable_for(self._pool, ticket):
            raise _no_backend(ticket, self._pool)
        cfg = lane.config
        if lane.waiting >= cfg.queue_limit and not self._make_room(ticket):
            raise Unavailable(
                f"lane {lane.name!r} is full: {cfg.queue_limit} requests already waiting",
                code="queue_full",
                retry_after=self.retry_after(ticket),
            )

    async def wait(self, ticket: Ticket) -> Backend:
        """Queue the ticket until a slot is handed to it, or its lane's deadline."""
        lane, cfg = ticket.lane, ticket.lane.config
        future: asyncio.Future[Backend] = asyncio.get_running_loop().create_future()
        waiter = self._enqueue(ticket, future)
        try:
            self._grant()
            async with asyncio.timeout(cfg.queue_timeout_s):
                return await future
        except TimeoutError:
            raise Unavailable(
                f"lane {lane.name!r}: no room within {cfg.queue_timeout_s:g}s",
                code="queue_timeout",
                retry_after=self.retry_after(ticket, waiter),
            ) from None
        finally:
            # Cancelling the task (a disconnect, the deadline) cancels the future too; a waiter
            # whose future is done is skipped by `_grant` and dropped from its queue there.
            future.cancel()
            self._left(waiter)
            # A slot granted to a waiter that then gave up stays on the ticket: the caller's
            # `finish` gives it back.

    def _enqueue(self, ticket: Ticket, future: asyncio.Future[Backend]) -> Waiter:
        lane, tenant = ticket.lane, ticket.tenant
        place = band_of(lane.config.priority, tenant)
        band = self._queues.get(place)
        if band is None:
            band = self._queues[place] = Band()
            bisect.insort(self._priorities, place)
        waiter = Waiter(ticket, future, band)
        cost = turn_cost(ticket)
        band.add(waiter, tenant, cost, held=lane.held.get(tenant.name, 0) * cost)
        places = self._places.get(id(lane))
        if places is None:
            places = self._places[id(lane)] = {}
        held = places.get(tenant.name)
        if held is None:
            held = places[tenant.name] = deque()
        held.append(waiter)
        lane.waiting += 1
        lane.queue_metrics.waiting(tenant.tier).inc()
        self.waiting += 1
        return waiter

    def _left(self, waiter: Waiter) -> None:
        if not waiter.counted:
            return
        waiter.counted = False
        ticket = waiter.ticket
        lane = ticket.lane
        lane.waiting -= 1
        self.waiting -= 1
        lane.queue_metrics.waiting(ticket.tenant.tier).dec()
        places = self._places[id(lane)]
        name = ticket.tenant.name
        held = places[name]
        held.remove(waiter)
        if not held:
            del places[name]
            if not places:
                del self._places[id(lane)]

    def _serve(self, waiter: Waiter, backend: Backend) -> None:
        """Hand `backend` to the waiter."""
        self._left(waiter)
        waiter.band.served(waiter)
        waiter.future.set_result(backend)

    def _make_room(self, ticket: Ticket) -> bool:
        """At a full lane: refuse the newest waiter of the key holding the most places for its
        weight, if that is more than the arriving key would hold with this request; whether a
        place was freed."""
        places = self._places.get(id(ticket.lane))
        if not places:
            return False
        tenant = ticket.tenant
        mine = places.get(tenant.name)
        need = ((len(mine) if mine is not None else 0) + 1) / tenant.weight
        victim = most_held(places, need)
        if victim is None:
            return False
        retry_after = self.retry_after(victim.ticket, victim)
        self._left(victim)
        ticket.lane.queue_metrics.displaced.inc()
        cfg = ticket.lane.config
        victim.future.set_exception(
            Unavailable(
                f"lane {ticket.lane.name!r} is full: {cfg.queue_limit} requests already waiting, "
                "this key's the most of them",
                code="queue_full",
                retry_after=retry_after,
            )
        )
        return True

    def retry_after(self, ticket: Ticket, waiter: Waiter | None = None) -> float:
        """When a request the lane's queue refuses should come back: once the lane's requests
        it would wait behind have drained at the lane's measured rate, and its own turn has
        come. For a waiter (its deadline passed, or its place was given up for another key's)
        they are those ahead of it; for an arrival, those ahead of where it would be placed.
        Counted in the order room is offered, so a key with few waiting is told a short wait
        and a flood a long one; a refusal path only, so a walk over the queue."""
        lane, tenant = ticket.lane, ticket.tenant
        place = band_of(lane.config.priority, tenant)
        ahead = 0
        for at in self._priorities:
            band = self._queues[at]
            if at < place:
                ahead += band.count(lane)
                continue
            if at == place:
                if waiter is not None:
                    ahead += band.ahead(lane, waiter.finish, waiter)
                else:
                    cost = turn_cost(ticket)
                    start = band.start_of(tenant, lane.held.get(tenant.name, 0) * cost)
                    ahead += band.ahead(lane, start + cost / tenant.weight)
            break
        cfg = lane.config
        return retry_after_s(lane.drain, ahead + 1, cfg.queue_timeout_s, time.monotonic())

    def wake(self) -> None:
        """Offer free slots to the waiters now — a limit rose, a backend joined the pool, or
        another process freed a slot — rather than at this process's next release."""
        if self.waiting:
            self._grant()

    def _grant(self) -> None:
        """Hand free slots to waiters in order, skipping those blocked for a known reason."""
        budget = _SCAN_LIMIT
        full_lanes: set[int] = set()
        short_blocked = long_blocked = False
        for place in self._priorities:
            band = self._queues[place]
            queue = band.waiters
            kept: list[Waiter] = []
            at, end = 0, len(queue)
            while at < end and budget:
                waiter = queue[at]
                at += 1
                if waiter.future.done():
                    continue  # gave up; already counted out
                budget -= 1
                ticket = waiter.ticket
                lane = ticket.lane
                blocked = long_blocked if ticket.long else short_blocked
                if blocked or id(lane) in full_lanes:
                    kept.append(waiter)
                    continue
                if not ticket.holds_lane and not lane_has_room(lane.in_flight, self.lane_limit(lane)):
                    full_lanes.add(id(lane))
                    kept.append(waiter)
                    continue
                backend = self.try_take(ticket)
                if backend is None:
                    # No backend has room for this length (or none is routable for this ticket).
                    if ticket.long:
                        long_blocked = True
                    elif not ticket.tried and ticket.adapter is None:
                        short_blocked = long_blocked = True
                    kept.append(waiter)
                    continue
                self._serve(waiter, backend)
            kept.extend(queue[at:])
            band.keep(kept)
            if short_blocked or not budget:
                return


_DOWN: Final = Health.DOWN


def turn_cost(ticket: Ticket) -> float:
    """What the request's turn costs its key in the fair order: one, or its tokens where its
    lane counts turns in tokens (`fair_by`)."""
    return float(ticket.tokens) if ticket.lane.config.fair_by == "tokens" else 1.0


def most_held(places: dict[str, deque[Waiter]], than: float) -> Waiter | None:
    """The newest waiter still waiting of the key holding the most places for its weight, if
    that is more than `than`."""
    most, found = than, None
    for held in places.values():
        newest = held[-1]
        share = len(held) / newest.ticket.tenant.weight
        if share > most and not newest.future.done():
            most, found = share, newest
    return found


def routable_for(pool: Members, ticket: Ticket) -> list[Backend]:
    """The backends the ticket may be sent to now: the pool's routable ones it was not sent to,
    or only its pinned backend; for an adapter's request, those that hold it (or may load it)."""
    found = routable(pool.backends, ticket.tried)
    pin = ticket.pin
    if pin is not None:
        found = [b for b in found if b is pin]
    need = ticket.adapter
    return found if need is None else candidates_for(found, need)


def _no_backend(ticket: Ticket, pool: Members) -> Unavailable:
    """What a request that no backend can take now is told: for one pinned to the backend that
    holds its stored response, that backend's state, not the pool's."""
    pin = ticket.pin
    need = ticket.adapter
    # Whatever is missing — a healthy backend, one holding the adapter (learned by the same
    # probes), the pinned one back — the health checker's next rounds are when it may come.
    retry_after = bounded_s(pool.back_in_s(time.monotonic()), ticket.lane.config.queue_timeout_s)
    if pin is None and need is not None and routable(pool.backends, ticket.tried):
        return Unavailable(
            f"no healthy backend of pool {ticket.lane.pool.name!r} holds adapter {need.name!r} now",
            code="adapter_unavailable",
            retry_after=retry_after,
        )
    if pin is None:
        return Unavailable(f"no healthy backend in pool {ticket.lane.pool.name!r}", retry_after=retry_after)
    state = (
        "unhealthy"
        if pin.health is _DOWN
        else "leaving the pool"
        if pin not in pool.backends
        else "unreachable"
    )
    return Unavailable(
        f"{pin.label}, which holds this response, is {state}: it is the only backend that can "
        "serve it; retry later, or start a new conversation",
        code="response_backend_unavailable",
        retry_after=retry_after,
    )


def charge(ticket: Ticket, backend: Backend) -> None:
    """Count the ticket against its lane (unless it holds its slot already) and `backend`."""
    if not ticket.holds_lane:
        ticket.holds_lane = True
        lane = ticket.lane
        lane.in_flight += 1
        held = lane.held
        name = ticket.tenant.name
        held[name] = held.get(name, 0) + 1
    backend.in_flight += 1
    backend.prefilling += 1
    if ticket.long:
        backend.long_prefilling += 1
    ticket.backend = backend
    ticket.prefilling = True


def _refused(
    ticket: Ticket, whole: PrefillLimits, part: PrefillLimits, lane_limit: int | None
) -> Unavailable:
    lane = ticket.lane
    pool = lane.pool.name
    if whole.refuses(ticket.long):
        return Unavailable(
            f"pool {pool!r} admits no prompts above {whole.long_prompt_tokens} tokens",
            code="long_prompt_refused",
            # No wait lets it through: the SDKs that read this header do not retry.
            headers={"x-should-retry": "false"},
        )
    # This process's part of a limit is 0; another process may take the request.
    if lane_limit == 0:
        what, code = f"lane {lane.name!r}", "no_share"
    elif part.max_prefilling == 0:
        what, code = f"pool {pool!r}", "no_share"
    else:
        what, code = (
            f"pool {pool!r} (for prompts above {part.long_prompt_tokens} tokens)",
            "long_prompt_refused",
        )
    return Unavailable(
        f"{what} admits no request through this router process: its part of the limit, split over "
        f"{part.processes} processes, is 0",
        code=code,
        # Another process may take it now: the least a client can be told.
        retry_after=1.0,
    )
