"""`round_robin`: each backend in turn, whatever its load."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from router.balance.base import Affinity, BalanceHooks, C, Strategy, StrategySettings


class RoundRobinSettings(StrategySettings):
    strategy: Literal["round_robin"] = "round_robin"


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, candidates: Sequence[C], affinity: Affinity) -> C:
        self._turn += 1
        return candidates[self._turn % len(candidates)]


def _build(settings: RoundRobinSettings, hooks: BalanceHooks) -> RoundRobin:
    return RoundRobin()


STRATEGY = Strategy(RoundRobinSettings, _build)
