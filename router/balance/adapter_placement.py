"""Where a LoRA adapter's requests go among the backends that hold it (router/fleet/adapters.py
chooses those): rendezvous hashing of the adapter's name over their origins, with a bound on
load, whatever the lane's own strategy. Every router replica ranks the holders alike without
sharing state, so each adapter keeps to the same backend — whose batch slots then hold it — and
spills to the next in rank only while the first is loaded past the bound."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

from router.balance.base import Affinity, AffinityKey, Balancer, C
from router.balance.prefix_affinity import rendezvous_score

# How far above the candidates' mean in-flight count the first in rank may be loaded before a
# request spills to the next: tighter than prefix affinity's default (1.0), under which the
# first of two holders never spills...
ADAPTER_SLACK: Final = 0.5
# ...but never below a few requests: a server batches several of one adapter's requests at no
# cost worth a second copy in another server's slots, and at low load the mean is below one.
ADAPTER_MIN_BOUND: Final = 4


class AdapterPlacement(Balancer):
    """Bounded-load rendezvous on the adapter's key (the ticket's affinity): the first in rank
    whose in-flight count, the request counted, stays within `(1 + slack) ×` the candidates'
    mean or `ADAPTER_MIN_BOUND`, whichever is more; past every bound, the first in rank."""

    name = "adapter_placement"

    def __init__(self, slack: float = ADAPTER_SLACK) -> None:
        self._slack = slack

    def pick(self, candidates: Sequence[C], affinity: Affinity) -> C:
        return self.rank(candidates, affinity)[0]

    def rank(self, candidates: Sequence[C], affinity: Affinity) -> tuple[C, bool]:
        """The pick, and whether it is the first in rank (False: it spilled)."""
        if len(candidates) == 1 or affinity is None:
            return candidates[0], True
        key = affinity.key if isinstance(affinity, AffinityKey) else affinity
        bound = load_bound(candidates, self._slack)
        ranked = sorted(candidates, key=lambda c: rendezvous_score(key, c.name), reverse=True)
        for i, c in enumerate(ranked):
            if c.in_flight + 1 <= bound:
                return c, i == 0
        return ranked[0], True


def load_bound(candidates: Sequence[C], slack: float = ADAPTER_SLACK) -> int:
    """How many requests in flight, the next one counted, a candidate may have and still take
    the next: `(1 + slack) ×` the candidates' mean, or `ADAPTER_MIN_BOUND`, whichever is more."""
    total = sum(c.in_flight for c in candidates) + 1
    return max(math.ceil((1 + slack) * total / len(candidates)), ADAPTER_MIN_BOUND)


ADAPTER_PLACEMENT: Final = AdapterPlacement()
