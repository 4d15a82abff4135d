"""How long a key's requests hold their slots: what a request refused at the key's
`max_concurrency` is told to wait.

At its cap a key's next slot frees when one of its requests in flight ends; with `slots` of them,
each held for a mean time, one ends every mean / `slots` on average. The mean is an exponentially
weighted one over the key's ended requests (one float update each, only for keys with a
`max_concurrency`), per router process: with several, each measures its own requests, which hold
the key's shared slots as long as anyone's do.
"""

from __future__ import annotations

import math
from typing import Final

# Weight of the newest request: about the last ten make the mean.
ALPHA: Final = 0.2
# Before any request of the key ended: nothing is known of how long one takes.
UNMEASURED_S: Final = 1.0


class Pace:
    """One key's measure, built with the key (router/keys/auth.py) and kept until a reload."""

    __slots__ = ("hold_s",)

    def __init__(self) -> None:
        self.hold_s = -1.0  # mean seconds a request held its slot; < 0: none ended yet

    def ended(self, held_s: float) -> None:
        mean = self.hold_s
        self.hold_s = held_s if mean < 0.0 else mean + ALPHA * (held_s - mean)

    def wait_s(self, slots: int, cap_s: float) -> float:
        """Whole seconds until one of `slots` busy slots is expected to free, within [1, cap_s]."""
        mean = self.hold_s
        if mean < 0.0 or slots <= 0:
            return max(1.0, min(UNMEASURED_S, cap_s))
        return max(1.0, min(float(math.ceil(mean / slots)), cap_s))
