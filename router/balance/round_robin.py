"""`round_robin`: each backend in turn, whatever its load."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from router.balance.base import Affinity, BalanceHooks, Balancer, C, Strategy
from router.balance.settings import RoundRobinSettings


class RoundRobin(Balancer):
    name = "round_robin"

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, candidates: Sequence[C], affinity: Affinity) -> C:
        self._turn += 1
        return candidates[self._turn % len(candidates)]


def _build(settings: RoundRobinSettings, hooks: BalanceHooks) -> RoundRobin:
    return RoundRobin()


STRATEGY: Final[Strategy[RoundRobinSettings]] = Strategy(RoundRobinSettings, _build)
