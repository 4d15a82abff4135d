"""What every balance strategy shares: the candidate a balancer sees, the affinity it may route
on, a scraped load corrected by the router's own sends, and how a strategy declares itself.

Pure: a balancer sees only the candidates' counters and stable names, never sockets or requests.
Compiled with the request path, as the strategies are: every admitted request calls a balancer's
`pick` (the settings models, pydantic, are in router/balance/settings.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Generic, Protocol, TypeVar

from mypy_extensions import mypyc_attr

from router.balance.settings import StrategySettings


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
    """What an affinity strategy routes on: `key` is ranked by rendezvous hashing (the same on
    every router replica); `chain` is the prompt's block fingerprints (router.request.facts.prefix_chain,
    over the whole message list), matched against the prompts recently sent to each backend so a
    growing context follows the backend that holds it. Matches shorter than `min_depth` blocks
    do not count."""

    key: bytes
    chain: tuple[bytes, ...] = ()
    min_depth: int = 1
    # The prompt's token ids as the engine sees them (model's tokenizer and chat template), for
    # strategies that match them against what each engine holds (`precise_prefix`); () when the
    # router cannot know them. `salt`: the cache salt the engine keys the prompt's blocks with.
    token_ids: Sequence[int] = ()
    salt: str | None = None


Affinity = AffinityKey | bytes | None


class Balancer(ABC):
    """A lane's balancer. An abstract class rather than a protocol so that admission's call of
    `pick` is a compiled call (docs/compiled.md); mypy refuses a balancer without its `pick`."""

    name: ClassVar[str] = ""

    @abstractmethod
    def pick(self, candidates: Sequence[C], affinity: Affinity) -> C:
        """One of the candidates with room (there is at least one)."""


@dataclass(frozen=True, slots=True)
class AffinityRequest:
    """What a request offers an affinity strategy: its prompt's block chain, the body's `user`,
    the `X-Session-Id` header, and the profile's repeated-prefix length (the default depth)."""

    chain: tuple[bytes, ...]
    user: str | None
    session: bytes | None
    default_min_tokens: int
    token_ids: Sequence[int] = ()
    salt: str | None = None


# Each named backend's cached leading tokens of a prompt (its token ids and cache salt), as its
# engine's KV events report them; None for a backend whose event stream the router does not follow
# (silent or lost).
CachedTokens = Callable[[Sequence[str], Sequence[int], str | None], Mapping[str, int | None]]


@dataclass(frozen=True, slots=True)
class BalanceHooks:
    """What a balancer may report back, and what it may ask of the pool: `on_affinity_hit` when a
    request went to its preferred backend (the `lane_router_prefix_affinity_hits_total` counter of
    the lane's pool); `cached_tokens`, the pool's view of its engines' prefix caches (None: the
    pool follows no KV events); `on_estimated(n)`, n backends of a placement judged by
    approximation because their event stream was silent or lost."""

    on_affinity_hit: Callable[[], None] | None = None
    cached_tokens: CachedTokens | None = None
    on_estimated: Callable[[int], None] | None = None


S = TypeVar("S", bound=StrategySettings)


# A plain Python class, even compiled: mypyc cannot build a generic dataclass as one of its own,
# and a strategy is read only when a lane is built.
@mypyc_attr(native_class=False)
@dataclass(frozen=True, slots=True)
class Strategy(Generic[S]):
    """A strategy as the registry knows it: its settings model, how one lane's balancer is
    built, and what the strategy needs from the rest of the router. `scrapes_load`: its picks
    read the backends' own vLLM load (router/fleet/scrape.py polls the pools of such lanes).
    `affinity`: the key it routes each request on (None: it routes on none). `token_ids`: it
    places on the prompt's token ids, which the router then works out for its lanes' requests
    (the model's tokenizer and chat template) and passes in `AffinityRequest.token_ids`."""

    settings: type[S]
    build: Callable[[S, BalanceHooks], Balancer]
    scrapes_load: bool = False
    affinity: Callable[[S, AffinityRequest], Affinity] | None = None
    token_ids: bool = False

    @property
    def name(self) -> str:
        tag: Any = self.settings.model_fields["strategy"].default
        return str(tag)


class Rotation:
    """The least of the candidates by some measure; ties rotate, so equal backends share the load
    even when they sit behind busier ones."""

    def __init__(self) -> None:
        self._turn = 0

    def least(self, candidates: Sequence[C], measure: Callable[[C], float]) -> C:
        self._turn += 1
        if len(candidates) == 1:
            return candidates[0]  # what the rotation below picks for one, without measuring
        lowest = min(measure(c) for c in candidates)
        tied = [c for c in candidates if measure(c) == lowest]
        return tied[self._turn % len(tied)]


# Weights of scraped vLLM load in `corrected_load`: a waiting request delays a new arrival more
# than a running one (it is ahead in the queue and the batch is already full), and a nearly full
# KV cache means the next admission may preempt.
WAITING_WEIGHT: Final = 1.0
KV_WEIGHT: Final = 4.0


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
