"""`least_load`: the backend with the least scraped vLLM load, every candidate compared.

Where `power_of_two` compares two random candidates, this one scans them all and takes the
lowest `load_score` — the backend's last scrape of `vllm:num_requests_running`, `_waiting` and
`kv_cache_usage_perc`, corrected by the requests this router sent or finished since
(router/balance/base.py `corrected_load`). Each send raises the chosen backend's score by one, so
one router spreads a burst between scrapes instead of piling it on the backend that looked idle.
It sees what least_outstanding cannot — load from other tenants, other router replicas or work
the router sent earlier that is still queued — and, unlike power_of_two, never picks the busier
of two backends by chance. Several replicas acting on the same scrape correct only for their own
sends, so for many replicas in front of one pool power_of_two herds less.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from router.balance.base import Affinity, BalanceHooks, Balancer, C, Candidate, Rotation, Strategy
from router.balance.settings import LeastLoadSettings


class LeastLoad(Balancer):
    """Lowest corrected load; ties rotate so equal backends share the load."""

    name = "least_load"

    def __init__(self) -> None:
        self._rotation = Rotation()

    def pick(self, candidates: Sequence[C], affinity: Affinity) -> C:
        return self._rotation.least(candidates, _load_score)


def _load_score(candidate: Candidate) -> float:
    return candidate.load_score


def _build(settings: LeastLoadSettings, hooks: BalanceHooks) -> LeastLoad:
    return LeastLoad()


STRATEGY: Final[Strategy[LeastLoadSettings]] = Strategy(LeastLoadSettings, _build, scrapes_load=True)
