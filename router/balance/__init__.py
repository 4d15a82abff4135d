"""Choosing a backend within a pool: the strategies (one module each), the registry that makes
them known to lane configs, and what they share. Pure: a balancer sees only the candidates'
counters and stable names, never sockets or requests."""

from __future__ import annotations

from router.balance.base import (
    KV_WEIGHT,
    WAITING_WEIGHT,
    Affinity,
    AffinityKey,
    AffinityRequest,
    BalanceHooks,
    Balancer,
    CachedTokens,
    Candidate,
    Strategy,
    corrected_load,
)
from router.balance.registry import (
    DEFAULT,
    STRATEGIES,
    BalanceSettings,
    affinity_for,
    make_balancer,
    places_on_token_ids,
    plain_form,
    routes_on_affinity,
    scrapes_load,
    strategy,
)
from router.balance.settings import StrategySettings

__all__ = [
    "DEFAULT",
    "KV_WEIGHT",
    "STRATEGIES",
    "WAITING_WEIGHT",
    "Affinity",
    "AffinityKey",
    "AffinityRequest",
    "BalanceHooks",
    "BalanceSettings",
    "Balancer",
    "CachedTokens",
    "Candidate",
    "Strategy",
    "StrategySettings",
    "affinity_for",
    "corrected_load",
    "make_balancer",
    "places_on_token_ids",
    "plain_form",
    "routes_on_affinity",
    "scrapes_load",
    "strategy",
]
