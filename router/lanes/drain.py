"""How fast a lane's queue drains, and so how long a refused client should wait before retrying.

A lane keeps an exponentially weighted mean of the time between its completions, counted only
while requests wait behind them: then completions are paced by the backends, not by arrivals, and
their spacing is the queue's drain rate. One float update per completion; the answer to a refused
client (`retry_after_s`) is the requests ahead times that spacing, bounded to [1 s, the lane's
`queue_timeout_s`]. The measure is per router process: with several, each sees the completions of
its own part of the lane's slots, which its own queue drains through.
"""

from __future__ import annotations

import math
from typing import Final

# Weight of the newest interval: about the last ten completions make the mean.
ALPHA: Final = 0.2
# Before any completion was measured: what a refused client is told, as no rate is known.
UNMEASURED_S: Final = 10.0


class Drain:
    """A lane's drain measure. A plain slotted class: every completion updates it."""

    __slots__ = ("interval_s", "last")

    def __init__(self) -> None:
        self.interval_s = -1.0  # mean seconds between backlogged completions; < 0: none measured
        self.last = -1.0  # when the last completion with requests waiting behind it happened

    def idle(self) -> None:
        """A request of the lane ended with none waiting. An idle spell would count as a slow
        drain: the next interval starts afresh."""
        self.last = -1.0

    def completed(self, now: float) -> None:
        """A request of the lane ended at `now` with others waiting for its slot."""
        last = self.last
        self.last = now
        if last < 0.0:
            return
        gap = now - last if now > last else 0.0
        mean = self.interval_s
        self.interval_s = gap if mean < 0.0 else mean + ALPHA * (gap - mean)


def retry_after_s(drain: Drain, ahead: int, cap_s: float, now: float) -> float:
    """Seconds until `ahead` requests have drained at the measured rate (whole), never above
    `cap_s` nor below 1. A queue that has not moved for longer than its mean interval drains at
    most that slowly now: a stalled backend is not answered with the rate it had."""
    mean = drain.interval_s
    if mean < 0.0:
        return max(1.0, min(UNMEASURED_S, cap_s))
    last = drain.last
    if last >= 0.0 and now - last > mean:
        mean = now - last
    return bounded_s(ahead * mean, cap_s)


def bounded_s(seconds: float, cap_s: float) -> float:
    """A Retry-After: whole seconds, never above `cap_s` nor below 1."""
    return max(1.0, min(float(math.ceil(seconds)), cap_s))
