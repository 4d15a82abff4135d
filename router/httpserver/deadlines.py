"""One timer per connection for whichever deadline applies to it now.

Deadlines move later all the time (every read of a request body); re-arming a timer for each
move would cost more than the reads. So the timer stays where it is, and when it fires it asks
for the deadline again: past it, the connection expires; not yet, the timer is set for it. The
timer is moved only when a deadline comes earlier than the one armed."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Final

from mypy_extensions import mypyc_attr

INF: Final = math.inf


# The base of the server's connections, and of the tests' probes of its timer (docs/compiled.md).
@mypyc_attr(allow_interpreted_subclasses=True)
class Watched(asyncio.Protocol):
    __slots__ = ("_timer", "_timer_at", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = INF

    def deadline(self) -> float:
        """The loop time at which the connection expires as it stands now; INF for none."""
        raise NotImplementedError

    def expired(self) -> None:
        raise NotImplementedError

    def rearm(self) -> None:
        """Call when a deadline may have come earlier (a new phase of the connection)."""
        deadline = self.deadline()
        if deadline != INF:
            self.arm_by(deadline)

    def arm_by(self, deadline: float) -> None:
        """`rearm` for a caller that knows the deadline `deadline()` gives now."""
        timer = self._timer
        if timer is not None:
            if self._timer_at <= deadline:
                return
            timer.cancel()
        self._set(deadline)

    def _set(self, deadline: float) -> None:
        self._timer_at = deadline
        self._timer = self.loop.call_at(deadline, self._fired)

    def _fired(self) -> None:
        self._timer = None
        deadline = self.deadline()
        if deadline == INF:
            return  # none applies now; the next phase that has one re-arms
        if self.loop.time() < deadline:
            self._set(deadline)
        else:
            self.expired()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def finally_after(self, delay: float, callback: Callable[[], object]) -> None:
        """Replace the deadlines by one last timer (the connection is ending)."""
        self.disarm()
        self._timer_at = INF
        self._timer = self.loop.call_later(delay, callback)
