"""The one timer of a connection: set once, moved only when a deadline comes earlier."""

from __future__ import annotations

import asyncio

from router.httpserver.deadlines import INF, Watched


class Probe(Watched):
    __slots__ = ("at", "expiry", "timers")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.at = INF
        self.expiry: asyncio.Future[float] = loop.create_future()
        self.timers = 0

    def _set(self, deadline: float) -> None:
        self.timers += 1
        super()._set(deadline)

    def deadline(self) -> float:
        return self.at

    def expired(self) -> None:
        self.expiry.set_result(self.loop.time())


async def test_a_deadline_moved_later_costs_no_timer_until_it_fires() -> None:
    probe = Probe(asyncio.get_running_loop())
    probe.at = probe.loop.time() + 0.05
    probe.rearm()
    for step in range(100):  # as every body read does
        probe.at = probe.loop.time() + 0.1 + step * 0.001
        probe.rearm()
    last = probe.at
    fired = await asyncio.wait_for(probe.expiry, 5)
    assert fired >= last
    assert probe.timers == 2  # the first, and one more when it fired early and looked again


async def test_an_earlier_deadline_moves_the_timer() -> None:
    probe = Probe(asyncio.get_running_loop())
    probe.at = probe.loop.time() + 60
    probe.rearm()
    probe.at = probe.loop.time() + 0.05
    probe.rearm()
    await asyncio.wait_for(probe.expiry, 5)  # not a minute


async def test_no_deadline_no_timer_and_an_ending_replaces_it() -> None:
    probe = Probe(asyncio.get_running_loop())
    probe.rearm()
    assert probe.timers == 0
    ended: asyncio.Future[None] = probe.loop.create_future()
    probe.at = probe.loop.time() + 0.01
    probe.rearm()
    probe.finally_after(0.02, lambda: ended.set_result(None))
    await asyncio.wait_for(ended, 5)
    assert not probe.expiry.done()
