"""Precise prefix placement: a request goes to the backend whose engine holds the most of its
prompt's leading tokens, as the engines' own KV events report them (router/fleet/kvindex.py),
within the same load bound as `prefix_affinity`.

Pure: the caller gives each backend's cached leading tokens for this prompt, or None for a
backend whose event stream the router does not follow (silent or lost). Such a backend is judged
as approximate placement would: the backend that rendezvous hashing of the request's key ranks
first is credited with the prefix the key stands for (`credit` tokens), the others with none. With
every stream silent this is exactly `prefix_affinity`'s rendezvous placement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Final

from router.balance.base import Affinity, AffinityKey, AffinityRequest, BalanceHooks, Balancer, C, Strategy
from router.balance.prefix_affinity import PrefixAffinity, prefix_depth, rendezvous_score
from router.balance.settings import PrecisePrefixSettings
from router.request.facts import PREFIX_BLOCK_CHARS
from router.request.tokens import CHARS_PER_TOKEN


def place(
    candidates: Sequence[C],
    cached: Mapping[str, int | None],
    key: bytes,
    credit: int,
    slack: float,
    penalty: float,
) -> tuple[C, int]:
    """The candidate with the highest score — cached leading tokens less `penalty` tokens per
    request in flight — among those within `(1 + slack) ×` the pool's mean in-flight load (all of
    them when none is); equal scores go by rendezvous rank of `key`, the same on every replica.
    Also returns how many candidates were judged by approximation (the fallback's metric)."""
    total = sum(c.in_flight for c in candidates) + 1
    bound = math.ceil((1 + slack) * total / len(candidates))
    room = [c for c in candidates if c.in_flight + 1 <= bound] or list(candidates)
    preferred = max(candidates, key=lambda c: rendezvous_score(key, c.name))

    def estimate(c: C) -> int:
        known = cached.get(c.name)
        if known is not None:
            return known
        return credit if c is preferred else 0

    best = max(room, key=lambda c: (estimate(c) - penalty * c.in_flight, rendezvous_score(key, c.name)))
    return best, sum(1 for c in candidates if cached.get(c.name) is None)


class PrecisePrefix(Balancer):
    """`precise_prefix`: `place` over the pool's view of its engines' caches (`hooks.cached_tokens`).
    A request without token ids (none could be worked out) or a pool that follows no KV events is
    placed as `prefix_affinity` places it, by its key alone. No key → least outstanding."""

    name = "precise_prefix"

    def __init__(self, settings: PrecisePrefixSettings, hooks: BalanceHooks) -> None:
        self._slack = settings.slack
        self._penalty = settings.penalty
        self._hooks = hooks
        self._approximate = PrefixAffinity(settings.slack, on_hit=hooks.on_affinity_hit)

    def pick(self, candidates: Sequence[C], affinity: Affinity) -> C:
        lookup = self._hooks.cached_tokens
        if not isinstance(affinity, AffinityKey) or not affinity.token_ids or lookup is None:
            return self._approximate.pick(candidates, affinity)
        cached = lookup([c.name for c in candidates], affinity.token_ids, affinity.salt)
        credit = affinity.min_depth * PREFIX_BLOCK_CHARS // CHARS_PER_TOKEN
        chosen, estimated = place(candidates, cached, affinity.key, credit, self._slack, self._penalty)
        hooks = self._hooks
        if estimated and hooks.on_estimated is not None:
            hooks.on_estimated(estimated)
        return chosen


def affinity_key(settings: PrecisePrefixSettings, request: AffinityRequest) -> Affinity:
    """`prefix_affinity`'s prefix key — the prompt's block at `min_tokens`, for backends judged by
    approximation and for ties — with the prompt's token ids. Prompts shorter than `min_tokens`
    get none (least outstanding)."""
    depth = prefix_depth(settings.min_tokens or request.default_min_tokens)
    chain = request.chain
    if len(chain) < depth:
        return None
    return AffinityKey(
        key=chain[depth - 1], chain=chain, min_depth=depth, token_ids=request.token_ids, salt=request.salt
    )


def _build(settings: PrecisePrefixSettings, hooks: BalanceHooks) -> PrecisePrefix:
    return PrecisePrefix(settings, hooks)


STRATEGY: Final[Strategy[PrecisePrefixSettings]] = Strategy(
    PrecisePrefixSettings, _build, affinity=affinity_key, token_ids=True
)
