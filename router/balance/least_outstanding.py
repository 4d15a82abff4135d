"""`least_outstanding`: the backend with the fewest of this router's requests in flight."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from router.balance.base import Affinity, BalanceHooks, C, Candidate, Rotation, Strategy, StrategySettings


class LeastOutstandingSettings(StrategySettings):
    strategy: Literal["least_outstanding"] = "least_outstanding"


class LeastOutstanding:
    """Fewest requests in flight; ties rotate so equal backends share the load."""

    name = "least_outstanding"

    def __init__(self) -> None:
        self._rotation = Rotation()

    def pick(self, candidates: Sequence[C], affinity: Affinity) -> C:
        return self._rotation.least(candidates, _in_flight)


def _in_flight(candidate: Candidate) -> float:
    return candidate.in_flight


def _build(settings: LeastOutstandingSettings, hooks: BalanceHooks) -> LeastOutstanding:
    return LeastOutstanding()


STRATEGY: Strategy[LeastOutstandingSettings] = Strategy(LeastOutstandingSettings, _build)
