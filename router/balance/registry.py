"""The balance strategies a lane may name, one module each, registered here.

A lane's `balance:` is validated against the union of the registered strategies' settings models,
tagged by `strategy`; the plain string form (`balance: round_robin`) stands for a strategy with
nothing but defaults. Everything the rest of the router asks of a lane's strategy goes through
the functions below, so no other module knows a strategy by its name. Adding a strategy is one
module declaring its `STRATEGY`, its settings model in router/balance/settings.py and one line in
`REGISTERED` (docs/balance.md).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from router.balance import (
    least_load,
    least_outstanding,
    power_of_two,
    precise_prefix,
    prefix_affinity,
    round_robin,
)
from router.balance.base import Affinity, AffinityRequest, BalanceHooks, Balancer, Strategy
from router.balance.settings import LeastOutstandingSettings, StrategySettings

REGISTERED: tuple[Strategy[Any], ...] = (
    least_outstanding.STRATEGY,
    round_robin.STRATEGY,
    power_of_two.STRATEGY,
    prefix_affinity.STRATEGY,
    least_load.STRATEGY,
    precise_prefix.STRATEGY,
)

STRATEGIES: Mapping[str, Strategy[Any]] = MappingProxyType({s.name: s for s in REGISTERED})

if TYPE_CHECKING:
    BalanceSettings = StrategySettings
else:
    # The union is built from the registry, so registering a strategy is all a lane config needs.
    _UNION = functools.reduce(operator.or_, (s.settings for s in REGISTERED))
    BalanceSettings = Annotated[_UNION, Field(discriminator="strategy")]

DEFAULT = LeastOutstandingSettings()


def strategy(settings: StrategySettings) -> Strategy[Any]:
    return STRATEGIES[settings.strategy]


def plain_form(value: object) -> object:
    """`balance: NAME` as the block it stands for, `{strategy: NAME}`; anything else unchanged."""
    return {"strategy": value} if isinstance(value, str) else value


def make_balancer(settings: StrategySettings, hooks: BalanceHooks | None = None) -> Balancer:
    """A new balancer for one lane (each lane keeps its own turn, random state and memory)."""
    return strategy(settings).build(settings, hooks or BalanceHooks())


def scrapes_load(settings: StrategySettings) -> bool:
    return strategy(settings).scrapes_load


def routes_on_affinity(settings: StrategySettings) -> bool:
    return strategy(settings).affinity is not None


def places_on_token_ids(settings: StrategySettings) -> bool:
    return strategy(settings).token_ids


def affinity_for(settings: StrategySettings, request: AffinityRequest) -> Affinity:
    """The key the lane's strategy routes this request on; None for strategies that route on none."""
    affinity = strategy(settings).affinity
    return None if affinity is None else affinity(settings, request)
