"""`prefix_affinity`: a request goes where its prompt's prefix is already cached, within a bound
on load, so the pool's prefix caches hit and a hot prefix cannot melt one backend."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Final

from router.balance.base import Affinity, AffinityKey, AffinityRequest, BalanceHooks, Balancer, C, Strategy
from router.balance.least_outstanding import LeastOutstanding
from router.balance.settings import PrefixAffinitySettings
from router.request.facts import PREFIX_BLOCK_CHARS
from router.request.tokens import CHARS_PER_TOKEN


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


class PrefixAffinity(Balancer):
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


def prefix_depth(min_tokens: int) -> int:
    """The prompt blocks (router.request.facts.prefix_chain) that stand for `min_tokens` tokens."""
    return max(1, -(-min_tokens * CHARS_PER_TOKEN // PREFIX_BLOCK_CHARS))


def affinity_key(settings: PrefixAffinitySettings, request: AffinityRequest) -> Affinity:
    """What a request routes on; the prompt's block chain covers the whole message list, and
    prompts shorter than `min_tokens` get no affinity.

    `prefix`: the rendezvous key is the chain's block at `min_tokens`, the shared document.
    `session`: `X-Session-Id`, else the body's `user`, else the prompt itself (its last block) —
    a conversation's first request is placed by its own content, and each later one, which
    extends it, follows it through the balancer's memory of recent prompts."""
    depth = prefix_depth(settings.min_tokens or request.default_min_tokens)
    chain = request.chain
    if settings.affinity == "session":
        if request.session:
            return AffinityKey(b"session\x00" + request.session, chain, depth)
        if request.user:
            return AffinityKey(b"user\x00" + request.user.encode(), chain, depth)
        if len(chain) < depth:
            return None
        return AffinityKey(chain[-1], chain, depth)
    if len(chain) < depth:
        return None
    return AffinityKey(chain[depth - 1], chain, depth)


def _build(settings: PrefixAffinitySettings, hooks: BalanceHooks) -> PrefixAffinity:
    return PrefixAffinity(settings.slack, on_hit=hooks.on_affinity_hit)


STRATEGY: Final[Strategy[PrefixAffinitySettings]] = Strategy(
    PrefixAffinitySettings, _build, affinity=affinity_key
)
