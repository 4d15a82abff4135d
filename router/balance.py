"""Choosing a backend within a pool. Pure: a balancer sees only the candidates' counters and
stable names, never sockets or requests."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar


class Candidate(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def in_flight(self) -> int: ...

    @property
    def load_score(self) -> float: ...


C = TypeVar("C", bound=Candidate)


@dataclass(frozen=True, slots=True)
class AffinityKey:
    """What prefix affinity routes on: `key` is ranked by rendezvous hashing (the same on every
    router replica); `chain` is the prompt's block fingerprints (router.facts.prefix_chain, over
    the whole message list), matched against the prompts recently sent to each backend so a
    growing context follows the backend that holds it. Matches shorter than `min_depth` blocks
    do not count."""

    key: bytes
    chain: tuple[bytes, ...] = ()
    min_depth: int = 1


Affinity = AffinityKey | bytes | None


class Balancer(Protocol):
    name: str

    def pick(self, candidates: Sequence[C], affinity: Affinity) -> C: ...


# Weights of scraped vLLM load in `corrected_load`: a waiting request delays a new arrival more
# than a running one (it is ahead in the queue and the batch is already full), and a nearly full
# KV cache means the next admission may preempt.
WAITING_WEIGHT = 1.0
KV_WEIGHT = 4.0


def corrected_load(
    in_flight: int,
    in_flight_at_scrape: int,
    running: float,
    waiting: float,
    kv_usage: float,
    scraped: bool,
) -> float:
    """A backend's load from its last scrape, corrected by what this router did since: every
    request sent (or finished) after the scrape moves the scraped count by one. Never below the
    router's own in-flight count, which is exact for this replica."""
    if not scraped:
        return float(in_flight)
    outstanding = max(float(in_flight), running + waiting + (in_flight - in_flight_at_scrape))
    return outstanding + WAITING_WEIGHT * waiting + KV_WEIGHT * kv_usage


class LeastOutstanding:
    """Fewest requests in flight; ties rotate so equal backends share the load."""

    name = "least_outstanding"

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, candidates: Sequence[C], affinity: Affinity) -> C:
        least = min(c.in_flight for c in candidates)
        tied = [c for c in candidates if c.in_flight == least]
        self._turn += 1
        return tied[self._turn % len(tied)]


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, candidates: Sequence[C], affinity: Affinity) -> C:
        self._turn += 1
        return candidates[self._turn % len(candidates)]


class PowerOfTwo:
    """Two random candidates, the less loaded wins: near-best balance at O(1) cost, and herd-free
    when several routers act on the same (slightly stale) scraped load."""

    name = "power_of_two"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def pick(self, candidates: Sequence[C], affinity: Affinity) -> C:
        if len(candidates) == 1:
            return candidates[0]
        a, b = self._rng.sample(range(len(candidates)), 2)
        ca, cb = candidates[a], candidates[b]
        return ca if ca.load_score <= cb.load_score else cb


class PrefixMemory:
    """Which backend each recent prompt went to, by the fingerprint of its whole prompt (its
    last full block). A later prompt that extends an earlier one — an agent step re-sending the
    conversation plus a tool result, a chat's next turn — finds it among its own blocks and can
    follow it to the backend that holds its context. Only whole prompts are recorded, so a
    prefix that many conversations share (a common system prompt) does not pull them all to
    one backend. Bounded: at most `max_entries` prompts, the oldest dropped first."""

    def __init__(self, max_entries: int = 65536) -> None:
        self._max = max_entries
        self._where: dict[bytes, str] = {}

    def __len__(self) -> int:
        return len(self._where)

    def longest(self, chain: Sequence[bytes], min_depth: int) -> str | None:
        """The backend of the longest recorded prompt that `chain` extends, if that prompt is at
        least `min_depth` blocks long."""
        where = self._where
        for i in range(len(chain) - 1, min_depth - 2, -1):
            found = where.get(chain[i])
            if found is not None:
                return found
        return None

    def record(self, chain: Sequence[bytes], backend: str) -> None:
        if not chain:
            return
        where = self._where
        block = chain[-1]
        where.pop(block, None)  # re-inserting moves it to the young end
        where[block] = backend
        if len(where) > self._max:
            del where[next(iter(where))]


class PrefixAffinity:
    """Prefix affinity with bounded load. The backend that served the longest earlier prompt this
    one extends wins (whole message list, `PrefixMemory`); otherwise rendezvous hashing of the key
    over backend names, so every router replica ranks backends identically without sharing state. A
    backend already above `(1 + epsilon) ×` the pool's mean in-flight load is passed over for the
    next in rank, so a hot prefix cannot melt one backend. No key → least outstanding.

    `on_hit` is called when the request went to its preferred backend (memory match, or the
    top of the rendezvous rank)."""

    name = "prefix_affinity"

    def __init__(
        self,
        epsilon: float = 1.0,
        *,
        memory: PrefixMemory | None = None,
        on_hit: Callable[[], None] | None = None,
    ) -> None:
        self._epsilon = epsilon
        self._fallback = LeastOutstanding()
        self._memory = memory if memory is not None else PrefixMemory()
        self._on_hit = on_hit

    @property
    def memory(self) -> PrefixMemory:
        return self._memory

    def pick(self, candidates: Sequence[C], affinity: Affinity) -> C:
        if affinity is None:
            return self._fallback.pick(candidates, None)
        key = affinity if isinstance(affinity, AffinityKey) else AffinityKey(affinity)
        chosen, hit = self._choose(candidates, key)
        self._memory.record(key.chain, chosen.name)
        if hit and self._on_hit is not None:
            self._on_hit()
        return chosen

    def _choose(self, candidates: Sequence[C], key: AffinityKey) -> tuple[C, bool]:
        if len(candidates) == 1:
            return candidates[0], True
        total = sum(c.in_flight for c in candidates) + 1
        bound = math.ceil((1 + self._epsilon) * total / len(candidates))
        if key.chain:
            holder = self._memory.longest(key.chain, key.min_depth)
            if holder is not None:
                for c in candidates:
                    if c.name == holder and c.in_flight + 1 <= bound:
                        return c, True
        ranked = sorted(candidates, key=lambda c: rendezvous_score(key.key, c.name), reverse=True)
        for i, c in enumerate(ranked):
            if c.in_flight + 1 <= bound:
                return c, i == 0
        return ranked[0], True

    @staticmethod
    def preferred(candidates: Sequence[C], affinity: bytes) -> C:
        return max(candidates, key=lambda c: rendezvous_score(affinity, c.name))


def rendezvous_score(affinity: bytes, name: str) -> int:
    digest = hashlib.blake2b(affinity + b"\x00" + name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def make_balancer(name: str, *, epsilon: float = 1.0, on_hit: Callable[[], None] | None = None) -> Balancer:
    if name == "prefix_affinity":
        return PrefixAffinity(epsilon, on_hit=on_hit)
    balancers: dict[str, type[LeastOutstanding | RoundRobin | PowerOfTwo]] = {
        "least_outstanding": LeastOutstanding,
        "round_robin": RoundRobin,
        "power_of_two": PowerOfTwo,
    }
    return balancers[name]()
