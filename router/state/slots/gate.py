"""Admission to one pool with counts shared by every router process (router/state/slots/store.py).

The queue is this process's own, as in `router.lanes.poolgate.PoolGate`, and so is its fairness
across keys: each process orders its own waiters by tier and weight, and the processes take the
shared slots as they come. What changes is the taking.
A take asks Redis, in one script, for the lane's slot and the first backend with room in an
order this process chose: the lane's balancer's pick among the backends as every process loads
them (the counts of the last answer), then the others, least loaded first. Releases are sent in
the background. A waiter is offered room again when a release of this process has reached
Redis, when another process frees a full resource (it publishes, and the store listens once
anyone here waits), and at least every RECHECK_S.

While the store is local (Redis failed moments ago) the gate is a plain `PoolGate` on this
process's parts of the limits, over the same own counts, which the store re-homes to Redis
once it is back; a lane's part is less what the other processes held beyond theirs at the last
look (router/state/slots/store.py), so the processes together stay within the lane's limit."""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from router.balance import corrected_load
from router.balance.adapter_placement import ADAPTER_PLACEMENT
from router.lanes.admission import PrefillLimits, choose_backend
from router.lanes.poolgate import Members, PoolGate, Ticket, _Waiter, charge, routable_for
from router.state.slots.arithmetic import LANE_FULL, NO_ROOM, SETTLING, SlotCounts, TakeRule
from router.state.slots.budget import Share
from router.state.slots.store import Change, SlotStore, TakeAnswer, limit_arg

if TYPE_CHECKING:
    from router.fleet.backend import Backend
    from router.lanes.ticket import GatedLane

RECHECK_S = 0.25
_SCAN_LIMIT = 256


@dataclass(eq=False, slots=True)
class _Seen:
    """A backend as the balancer sees it here: with the counts of every process."""

    backend: Backend
    name: str
    in_flight: int
    prefilling: int
    long_prefilling: int

    @property
    def load_score(self) -> float:
        # The scrape's correction is what this process sent since it (router/fleet/scrape.py), on
        # top of the scraped load, which counts every process's requests already.
        b = self.backend
        since = b.in_flight - b.in_flight_at_scrape
        return corrected_load(
            self.in_flight,
            self.in_flight - since,
            b.scraped_running,
            b.scraped_waiting,
            b.scraped_kv_usage,
            b.scraped,
        )


class SharedPoolGate(PoolGate):
    def __init__(
        self,
        limits: PrefillLimits,
        pool: Members,
        share: Share,
        store: SlotStore,
    ) -> None:
        super().__init__(limits, pool, share)
        self._seen: weakref.WeakKeyDictionary[Backend, SlotCounts] = weakref.WeakKeyDictionary()
        self._backends: weakref.WeakSet[Backend] = weakref.WeakSet()
        self._lanes: weakref.WeakSet[GatedLane] = weakref.WeakSet()
        self._granter: asyncio.Task[None] | None = None
        self._woken = asyncio.Event()
        self.rebind(store)

    def rebind(self, store: SlotStore) -> None:
        """Count in `store` from now on (a reload changed the `state:` section); the new store
        re-homes what this process holds on its first admission."""
        self.store = store
        store.register(self)

    def held(self) -> tuple[list[Backend], list[GatedLane]]:
        return list(self._backends), list(self._lanes)

    def lane_part(self, lane: GatedLane) -> int | None:
        """This process's part of the lane's `max_in_flight`, as the profile splits it."""
        return PoolGate.lane_limit(self, lane)

    def lane_limit(self, lane: GatedLane) -> int | None:
        """While counting locally: this process's part, less what the other processes held
        beyond theirs when it last looked at Redis (what they hold counts against the limit
        as much as what this process holds)."""
        part = self.lane_part(lane)
        if part is None:
            return None
        return max(0, part - self.store.excess(lane))

    # -- taking -----------------------------------------------------------------------------

    def try_take(self, ticket: Ticket) -> Backend | None:
        if not self.store.serves_locally():
            return None
        lane = ticket.lane
        if not ticket.holds_lane:
            limit = self.lane_limit(lane)
            if limit is not None and lane.in_flight >= limit:
                return None
        backend = super().try_take(ticket)
        if backend is not None:
            self._note(ticket, backend)
            self.store.counted_locally()
        return backend

    async def acquire(self, ticket: Ticket) -> Backend:
        if not await self.store.ready():
            return await self._acquire_locally(ticket)
        if not self.waiting:
            backend = await self._take(ticket)
            if backend is not None:
                return backend
            if not self.store.counts_shared:
                return await self._acquire_locally(ticket)
        self.refuse_hopeless(ticket, self.whole, ticket.lane.config.max_in_flight)
        return await self.wait(ticket)

    async def _acquire_locally(self, ticket: Ticket) -> Backend:
        """`PoolGate.acquire` on this process's parts. A part reduced to nothing by what the
        others hold is waited out (Redis may come back), not refused as a part of 0 is."""
        if not self.waiting:
            backend = self.try_take(ticket)
            if backend is not None:
                return backend
        self.refuse_hopeless(ticket, self.limits, self.lane_part(ticket.lane))
        return await self.wait(ticket)

    async def _take(self, ticket: Ticket) -> Backend | None:
        order, rule = self._order(ticket), self._rule(ticket)
        if not order:
            return None
        task = asyncio.ensure_future(self.store.take(ticket.lane, order, rule))
        try:
            answer = await asyncio.shield(task)
        except asyncio.CancelledError:
            # Redis may charge the request anyway: give back what it took once it answers.
            task.add_done_callback(lambda done: self._unclaimed(done, ticket.lane, order, rule))
            raise
        return self._claim(ticket, order, rule, answer)

    def _rule(self, ticket: Ticket) -> TakeRule:
        lane = ticket.lane
        return TakeRule(
            take_lane=not ticket.holds_lane,
            lane_limit=lane.config.max_in_flight,
            long=ticket.long,
            limits=self.whole,
            lane_part=self.lane_part(lane),
        )

    def _order(self, ticket: Ticket) -> list[Backend]:
        seen = [self._view(b) for b in routable_for(self._pool, ticket)]
        if not seen:
            return []
        lane = ticket.lane
        balancer = lane.balancer if ticket.adapter is None else ADAPTER_PLACEMENT
        first = choose_backend(seen, self.whole, ticket.long, balancer, ticket.affinity)
        rest = sorted(seen, key=lambda s: (s.prefilling, s.in_flight))
        if first is not None:
            rest.remove(first)
            rest.insert(0, first)
        return [s.backend for s in rest]

    def _view(self, backend: Backend) -> _Seen:
        c = self._seen.get(backend) or SlotCounts()
        return _Seen(
            backend=backend,
            name=backend.name,
            in_flight=c.in_flight,
            prefilling=c.prefilling,
            long_prefilling=c.long_prefilling,
        )

    def _claim(
        self, ticket: Ticket, order: Sequence[Backend], rule: TakeRule, answer: TakeAnswer | None
    ) -> Backend | None:
        if answer is None:
            return None
        for backend, counts in zip(order, answer.counts, strict=False):
            self._seen[backend] = counts
        if answer.result <= 0:
            return None
        backend = order[answer.result - 1]
        charge(ticket, backend)
        self._note(ticket, backend)
        store = self.store
        if answer.holder != store.holder and store.counts_shared:
            # Charged under a holder the store has re-homed away since: charge the current one.
            store.give_back(self._moves(store.holder, ticket.lane, backend, rule, 1))
        return backend

    def _unclaimed(
        self,
        done: asyncio.Future[TakeAnswer | None],
        lane: GatedLane,
        order: Sequence[Backend],
        rule: TakeRule,
    ) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        answer = done.result()
        if answer is not None and answer.result > 0 and self.store.counts_shared:
            backend = order[answer.result - 1]
            self.store.give_back(self._moves(answer.holder, lane, backend, rule, -1))

    def _moves(
        self, holder: str, lane: GatedLane, backend: Backend, rule: TakeRule, sign: int
    ) -> list[Change]:
        key = self.store.backend_key(backend)
        changes = [
            Change(holder, key, "f", sign),
            Change(holder=holder, key=key, counter="p", delta=sign, limit=self._limit("p")),
        ]
        if rule.long:
            changes.append(Change(holder=holder, key=key, counter="l", delta=sign, limit=self._limit("l")))
        if rule.take_lane:
            lane_key = self.store.lane_key(lane)
            changes.append(
                Change(holder=holder, key=lane_key, counter="f", delta=sign, limit=limit_arg(rule.lane_limit))
            )
        return changes

    def _limit(self, counter: str) -> int:
        whole = self.whole
        return limit_arg(whole.max_prefilling if counter == "p" else whole.max_long_prefilling)

    def _note(self, ticket: Ticket, backend: Backend) -> None:
        self._backends.add(backend)
        self._lanes.add(ticket.lane)

    # -- giving back ------------------------------------------------------------------------

    def end_prefill(self, ticket: Ticket) -> None:
        backend = ticket.backend
        if ticket.prefilling and backend is not None and self.store.counts_shared:
            self._send(backend, "p", self._limit("p"))
            if ticket.long:
                self._send(backend, "l", self._limit("l"))
        super().end_prefill(ticket)

    def end_attempt(self, ticket: Ticket) -> None:
        backend = ticket.backend
        if backend is not None and self.store.counts_shared:
            self._send(backend, "f", -1)
        super().end_attempt(ticket)

    def finish(self, ticket: Ticket) -> None:
        lane = ticket.lane
        if ticket.holds_lane and self.store.counts_shared:
            store = self.store
            limit = limit_arg(lane.config.max_in_flight)
            store.give_back(
                [Change(holder=store.holder, key=store.lane_key(lane), counter="f", delta=-1, limit=limit)]
            )
        super().finish(ticket)

    def _send(self, backend: Backend, counter: str, limit: int) -> None:
        store = self.store
        key = store.backend_key(backend)
        store.give_back([Change(holder=store.holder, key=key, counter=counter, delta=-1, limit=limit)])
        seen = self._seen.get(backend)
        if seen is not None:
            self._seen[backend] = _minus(seen, counter)

    # -- waiting ----------------------------------------------------------------------------

    def _grant(self) -> None:
        if self.store.serves_locally():
            super()._grant()
        elif not self.store.releasing:
            self._grant_from_store()  # else the releases' arrival at Redis wakes the gate

    def wake(self) -> None:
        if not self.waiting:
            return
        if self.store.serves_locally():
            super()._grant()
        else:
            self._grant_from_store()

    def _grant_from_store(self) -> None:
        """Offer room to the waiters again, from Redis's counts."""
        if self._granter is None:
            self._granter = asyncio.get_running_loop().create_task(self._grant_while_waiting())
        else:
            self._woken.set()

    async def _grant_while_waiting(self) -> None:
        try:
            while self.waiting:
                self._woken.clear()
                if not await self.store.ready():
                    super()._grant()
                    return
                if not await self._grant_pass():
                    self.store.watch()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(RECHECK_S):
                            await self._woken.wait()
        finally:
            self._granter = None

    async def _grant_pass(self) -> bool:
        """Offer room to the waiters in order, as `PoolGate._grant` does, one take each;
        whether anyone was served (or the store changed mode, so it is worth looking again)."""
        granted = False
        full_lanes: set[int] = set()
        short_blocked = long_blocked = False
        for waiter in self._in_order():
            ticket = waiter.ticket
            if waiter.future.done() or (long_blocked if ticket.long else short_blocked):
                continue
            if id(ticket.lane) in full_lanes:
                continue
            order, rule = self._order(ticket), self._rule(ticket)
            answer = await self.store.take(ticket.lane, order, rule) if order else _NOWHERE
            if answer is not None and answer.result == SETTLING:
                break  # nobody is granted a slot until the processes have re-homed
            if answer is None or answer.result < LANE_FULL:
                return True  # the store is local, or re-homing: look again in its new mode
            if answer.result == LANE_FULL:
                full_lanes.add(id(ticket.lane))
            elif answer.result == NO_ROOM:
                self._claim(ticket, order, rule, answer)
                if ticket.long:
                    long_blocked = True
                elif not ticket.tried and ticket.adapter is None:
                    # (a request held to some backends, or to an adapter's, blocks no other)
                    short_blocked = long_blocked = True
            elif waiter.future.done():  # it gave up while Redis answered
                self._claim_for_nobody(ticket.lane, order, rule, answer)
            else:
                backend = self._claim(ticket, order, rule, answer)
                assert backend is not None
                self._serve(waiter, backend)
                granted = True
        self._prune()
        return granted

    def _claim_for_nobody(
        self, lane: GatedLane, order: Sequence[Backend], rule: TakeRule, answer: TakeAnswer
    ) -> None:
        backend = order[answer.result - 1]
        self.store.give_back(self._moves(answer.holder, lane, backend, rule, -1))

    def _in_order(self) -> list[_Waiter]:
        waiters: list[_Waiter] = []
        for place in self._priorities:
            waiters += [w for w in self._queues[place].waiters if not w.future.done()]
            if len(waiters) >= _SCAN_LIMIT:
                return waiters[:_SCAN_LIMIT]
        return waiters

    def _prune(self) -> None:
        for band in self._queues.values():
            if any(w.future.done() for w in band.waiters):
                band.keep([w for w in band.waiters if not w.future.done()])


_NOWHERE = TakeAnswer("", NO_ROOM, 0, ())


def _minus(counts: SlotCounts, counter: str) -> SlotCounts:
    field = {"f": "in_flight", "p": "prefilling", "l": "long_prefilling"}[counter]
    return replace(counts, **{field: max(0, getattr(counts, field) - 1)})
