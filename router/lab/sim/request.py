"""One request inside the simulated engine, and how long its answer will be."""

from __future__ import annotations

import enum
import math
import random
import zlib
from array import array
from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort"]

# Natural answer lengths when the client lets the model stop: log-normal around 160 tokens.
_NATURAL_MEDIAN = 160.0
_NATURAL_SIGMA = 0.9


class Status(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    FINISHED = 2


def request_seed(prompt_token_ids: list[int], seed: int | None) -> int:
    """A request's seed: its own `seed` parameter mixed with its prompt, so equal requests get
    equal answers and different prompts different ones."""
    digest = zlib.crc32(array("I", [t & 0xFFFFFFFF for t in prompt_token_ids[-64:]]).tobytes())
    return (digest ^ ((seed or 0) * 0x9E3779B1)) & 0xFFFFFFFF


def planned_output(
    *, max_tokens: int, min_tokens: int, ignore_eos: bool, seed: int
) -> tuple[int, FinishReason]:
    """How many tokens the request generates and why it stops. With `ignore_eos` it runs to
    `max_tokens`; otherwise it stops at a seeded natural length within [min_tokens, max_tokens]."""
    if ignore_eos:
        return max_tokens, "length"
    rng = random.Random(seed)
    natural = max(1, round(_NATURAL_MEDIAN * math.exp(rng.gauss(0.0, _NATURAL_SIGMA))))
    natural = max(natural, min_tokens)
    if natural >= max_tokens:
        return max_tokens, "length"
    return natural, "stop"


@dataclass(slots=True, eq=False)
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    output_len: int
    stop_reason: FinishReason = "length"
    priority: int = 0
    seed: int = 0
    arrival_time: float = 0.0  # when the client's request reached the server
    cache_salt: str | None = None  # keys the prompt's cached blocks apart, as vLLM's
    # Engine state below.
    token_ids: list[int] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    status: Status = Status.WAITING
    order: int = 0  # admission order into the engine, the fcfs tie-break
    block_hashes: list[int] = field(default_factory=list)
    queued_time: float = 0.0
    scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    finish_reason: FinishReason | None = None
    handle: Any = None  # the driver's own per-request object (a stream, a trace record)

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def is_decoding(self) -> bool:
        return self.num_computed_tokens == len(self.token_ids) - 1 and self.num_output_tokens > 0

    @property
    def finished(self) -> bool:
        return self.status == Status.FINISHED

    def sort_key(self, policy: str) -> tuple[int, int]:
        return (self.priority, self.order) if policy == "priority" else (0, self.order)


def new_request(
    request_id: str,
    prompt_token_ids: list[int],
    *,
    max_tokens: int,
    min_tokens: int = 0,
    ignore_eos: bool = False,
    seed: int | None = None,
    priority: int = 0,
    arrival_time: float = 0.0,
    cache_salt: str | None = None,
) -> EngineRequest:
    """An engine request with its answer length planned from the request itself."""
    s = request_seed(prompt_token_ids, seed)
    n, reason = planned_output(max_tokens=max_tokens, min_tokens=min_tokens, ignore_eos=ignore_eos, seed=s)
    return EngineRequest(
        request_id=request_id,
        prompt_token_ids=list(prompt_token_ids),
        max_tokens=max_tokens,
        output_len=n,
        stop_reason=reason,
        priority=priority,
        seed=s,
        arrival_time=arrival_time,
        cache_salt=cache_salt,
    )
