"""`power_of_two`: two random candidates, the one with less scraped vLLM load wins."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Final

from router.balance.base import Affinity, BalanceHooks, Balancer, C, Strategy
from router.balance.settings import PowerOfTwoSettings


class PowerOfTwo(Balancer):
    """Two random candidates, the less loaded wins: near-best balance at O(1) cost, and herd-free
    when several routers act on the same (slightly stale) scraped load."""

    name = "power_of_two"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def pick(self, candidates: Sequence[C], affinity: Affinity) -> C:
        if len(candidates) == 1:
            return candidates[0]
        a, b = self._rng.sample(range(len(candidates)), 2)
        ca, cb = candidates[a], candidates[b]
        return ca if ca.load_score <= cb.load_score else cb


def _build(settings: PowerOfTwoSettings, hooks: BalanceHooks) -> PowerOfTwo:
    return PowerOfTwo()


STRATEGY: Final[Strategy[PowerOfTwoSettings]] = Strategy(PowerOfTwoSettings, _build, scrapes_load=True)
