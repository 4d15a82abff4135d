"""Admission decisions, pure: may a request start now, and on which backend of its pool?

A request outside its lane's shape (`max_prompt_tokens`, `max_output_tokens`) is refused;
then two limits apply (docs/design.md, the request path):

* per lane, `max_in_flight` requests at once;
* per backend, the partial-prefill rule of vLLM before 0.27, enforced by the router on any version: at
  most `max_prefilling` requests still waiting for their first token, of which at most
  `max_long_prefilling` long ones. `max_long_prefilling < max_prefilling` (validated), so
  however many long prompts are queued, a short one always finds room to enter the scheduler.

A process that is one of several without shared state enforces its part of each limit
(`PrefillLimits.part`, router/state/slots/budget.py); with shared state the whole limits are checked
in Redis by scripts that do this module's arithmetic (`PrefillLimits.has_room`,
router/state/slots/scripts.py).

The waiting itself (a priority queue with deadlines) is `router.lanes.poolgate.PoolGate`; this module
holds only the rules, so the virtual-clock simulator and tests can call them directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from router.balance import Affinity, Balancer, Candidate
from router.config.models import DEFAULT_LONG_PROMPT_TOKENS, LaneConfig, PoolConfig
from router.errors import BadRequest
from router.state.slots.budget import Share, prefill_parts


class Prefilling(Protocol):
    @property
    def prefilling(self) -> int: ...

    @property
    def long_prefilling(self) -> int: ...


class PrefillCounts(Candidate, Prefilling, Protocol):
    pass


B = TypeVar("B", bound=PrefillCounts)


@dataclass(frozen=True, slots=True)
class PrefillLimits:
    """A pool's per-backend partial-prefill limits; `max_prefilling=None` means no limit.
    `processes` > 1: these are one process's parts of limits split over that many."""

    max_prefilling: int | None = None
    max_long_prefilling: int | None = None
    long_prompt_tokens: int = DEFAULT_LONG_PROMPT_TOKENS
    prefill_tokens_per_s: float | None = None
    processes: int = 1

    @classmethod
    def for_pool(cls, pool: PoolConfig) -> PrefillLimits:
        adm = pool.admission
        threshold = adm.long_prompt_tokens
        if threshold is None:
            vllm_threshold = pool.vllm.long_prefill_token_threshold
            threshold = vllm_threshold if vllm_threshold > 0 else DEFAULT_LONG_PROMPT_TOKENS
        return cls(
            max_prefilling=adm.max_prefilling,
            max_long_prefilling=adm.max_long_prefilling,
            long_prompt_tokens=threshold,
            prefill_tokens_per_s=adm.prefill_tokens_per_s,
        )

    def part(self, share: Share) -> PrefillLimits:
        """This process's part of the limits (themselves when it is the only one)."""
        if share.alone:
            return self
        whole, long = prefill_parts(share, self.max_prefilling, self.max_long_prefilling)
        return replace(self, max_prefilling=whole, max_long_prefilling=long, processes=share.processes)

    @property
    def enabled(self) -> bool:
        return self.max_prefilling is not None

    def is_long(self, prompt_tokens: int) -> bool:
        return prompt_tokens > self.long_prompt_tokens

    def refuses(self, long: bool) -> bool:
        """`max_long_prefilling: 0` keeps long prompts off the pool entirely; a part of 0 keeps
        them (or, for `max_prefilling`, every prompt) off this process."""
        return (long and self.max_long_prefilling == 0) or self.max_prefilling == 0

    def has_room(self, backend: Prefilling, long: bool) -> bool:
        limit = self.max_prefilling
        if limit is None:
            return True
        if backend.prefilling >= limit:
            return False
        long_limit = self.max_long_prefilling
        return not long or long_limit is None or backend.long_prefilling < long_limit

    def blind_hold_s(self, prompt_tokens: int) -> float | None:
        """How long a non-streamed request (whose first token cannot be seen) counts as
        prefilling, if the pool says how fast it prefills; None: until its response starts."""
        rate = self.prefill_tokens_per_s
        return None if rate is None else prompt_tokens / rate


def lane_has_room(in_flight: int, max_in_flight: int | None) -> bool:
    return max_in_flight is None or in_flight < max_in_flight


def choose_backend(
    candidates: Sequence[B],
    limits: PrefillLimits,
    long: bool,
    balancer: Balancer,
    affinity: Affinity,
) -> B | None:
    """The balancer's pick among the candidates with prefill room; None when none has room."""
    if limits.max_prefilling is not None:
        candidates = [c for c in candidates if limits.has_room(c, long)]
    if not candidates:
        return None
    return balancer.pick(candidates, affinity)


def outside_lane_shape(
    lane: str, cfg: LaneConfig, prompt_tokens: int, output_tokens: int | None
) -> BadRequest | None:
    """A lane's `max_prompt_tokens` / `max_output_tokens` are the request shape its pool was
    sized and measured for (its capacity-evidence target); a request beyond them is refused up
    front rather than sent to a pool that never showed it can serve it. `output_tokens` is all
    the output the request states (its bound times its sequences); a request that states none
    gets a bound within the lane's written into it (router.request.rewrite)."""
    if cfg.max_prompt_tokens is not None and prompt_tokens > cfg.max_prompt_tokens:
        return BadRequest(
            f"the prompt (about {prompt_tokens} tokens) is longer than lane {lane!r} accepts "
            f"({cfg.max_prompt_tokens} tokens)",
            code="context_length_exceeded",
        )
    cap = cfg.max_output_tokens
    if cap is not None and output_tokens is not None and output_tokens > cap:
        return BadRequest(
            f"the request asks for {output_tokens} output tokens; lane {lane!r} accepts {cap}",
            code="max_tokens_exceeded",
        )
    return None
