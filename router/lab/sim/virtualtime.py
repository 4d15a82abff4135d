"""An asyncio event loop whose clock is virtual: it jumps to the next timer whenever nothing is
ready to run, so sleeps take no wall-clock time and a loaded host cannot stretch them.

The simulated servers (`serve.SimCluster`) and the lab's measuring clients (`timedstream`,
`calibrate`, `chunked`, `compare`) read time only through the running loop (`loop.time()`,
`asyncio.sleep`, timeouts). Run together on this loop, over real sockets on loopback, every
latency they measure is the one the timing model prescribes, however busy the machine: CPU work
takes no virtual time, and a late wake-up of the process cannot happen, since time moves only
when the loop has nothing left to do.

Time may jump only when nothing can still arrive without the loop's own work. A loopback write
is in the peer socket's buffer when the send returns, so a non-blocking poll that finds nothing
proves every socket idle; work handed to a thread (the resolver behind `getaddrinfo`, say) is
different, and while any is out the loop waits for it in real time with its clock standing.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any, TypeVar, TypeVarTuple

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

# While a thread works for the loop, how long one real wait lasts before looking again.
_THREAD_POLL_S = 0.05


class _Clock:
    __slots__ = ("now", "threads")

    def __init__(self) -> None:
        self.now = 0.0
        self.threads = 0  # executor jobs not yet done: time stands while any is out

    def thread_done(self, _: object) -> None:
        self.threads -= 1


class _Selector(selectors.DefaultSelector):
    """Polls the sockets without blocking; advances the clock instead of waiting for a timer."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None or timeout <= 0:
            # No timer (wait for I/O, i.e. a thread or the outside) or something ready: real.
            return super().select(timeout)
        ready = super().select(0)
        if ready:
            return ready
        if self._clock.threads:
            return super().select(min(timeout, _THREAD_POLL_S))
        self._clock.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """`time()` is virtual, starting at 0; it advances only to the next due timer."""

    def __init__(self) -> None:
        self._clock = _Clock()
        super().__init__(_Selector(self._clock))

    def time(self) -> float:
        return self._clock.now

    def run_in_executor(
        self, executor: Executor | None, func: Callable[[*Ts], T], *args: *Ts
    ) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self._clock.threads += 1
        future.add_done_callback(self._clock.thread_done)
        return future


def run_in_virtual_time(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to completion on a fresh `VirtualTimeLoop`."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main)
