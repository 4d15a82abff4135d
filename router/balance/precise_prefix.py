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

from router.balance.base import C
from router.balance.prefix_affinity import rendezvous_score


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
