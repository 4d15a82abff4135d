"""`least_outstanding`: the backend with the fewest of this router's requests in flight."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from router.balance.base import Affinity, BalanceHooks, Balancer, C, Candidate, Rotation, Strategy
from router.balance.settings import LeastOutstandingSettings


class LeastOutstanding(Balancer):
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


STRATEGY: Final[Strategy[LeastOutstandingSettings]] = Strategy(LeastOutstandingSettings, _build)
