"""Choosing a backend within a pool. Pure: a balancer sees only the candidates' counters and
stable names, never sockets or requests."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from typing import Protocol, TypeVar


class Candidate(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def in_flight(self) -> int: ...

    @property
    def load_score(self) -> float: ...


C = TypeVar("C", bound=Candidate)


class Balancer(Protocol):
    name: str

    def pick(self, candidates: Sequence[C], affinity: bytes | None) -> C: ...


class LeastOutstanding:
    """Fewest requests in flight; ties rotate so equal backends share the load."""

    name = "least_outstanding"

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, candidates: Sequence[C], affinity: bytes | None) -> C:
        least = min(c.in_flight for c in candidates)
        tied = [c for c in candidates if c.in_flight == least]
        self._turn += 1
        return tied[self._turn % len(tied)]


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, candidates: Sequence[C], affinity: bytes | None) -> C:
        self._turn += 1
        return candidates[self._turn % len(candidates)]


class PowerOfTwo:
    """Two random candidates, the less loaded wins: near-best balance at O(1) cost, and herd-free
    when several routers act on the same (slightly stale) scraped load."""

    name = "power_of_two"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def pick(self, candidates: Sequence[C], affinity: bytes | None) -> C:
        if len(candidates) == 1:
            return candidates[0]
        a, b = self._rng.sample(range(len(candidates)), 2)
        ca, cb = candidates[a], candidates[b]
        return ca if ca.load_score <= cb.load_score else cb


class PrefixAffinity:
    """Rendezvous hashing of the prefix fingerprint over backend names, so every router replica
    ranks backends identically without sharing state; a backend already above
    `(1 + epsilon) ×` the pool's mean in-flight load is passed over for the next in rank, so a hot
    prefix cannot melt one backend. No fingerprint → least outstanding."""

    name = "prefix_affinity"

    def __init__(self, epsilon: float = 0.25) -> None:
        self._epsilon = epsilon
        self._fallback = LeastOutstanding()

    def pick(self, candidates: Sequence[C], affinity: bytes | None) -> C:
        if affinity is None or len(candidates) == 1:
            return self._fallback.pick(candidates, None)
        ranked = sorted(candidates, key=lambda c: rendezvous_score(affinity, c.name), reverse=True)
        total = sum(c.in_flight for c in candidates) + 1
        bound = math.ceil((1 + self._epsilon) * total / len(candidates))
        for c in ranked:
            if c.in_flight + 1 <= bound:
                return c
        return ranked[0]

    @staticmethod
    def preferred(candidates: Sequence[C], affinity: bytes) -> C:
        return max(candidates, key=lambda c: rendezvous_score(affinity, c.name))


def rendezvous_score(affinity: bytes, name: str) -> int:
    digest = hashlib.blake2b(affinity + b"\x00" + name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def make_balancer(name: str) -> Balancer:
    balancers: dict[str, type[LeastOutstanding | RoundRobin | PowerOfTwo | PrefixAffinity]] = {
        "least_outstanding": LeastOutstanding,
        "round_robin": RoundRobin,
        "power_of_two": PowerOfTwo,
        "prefix_affinity": PrefixAffinity,
    }
    return balancers[name]()
