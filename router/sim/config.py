"""The simulated engine's configuration: vLLM's scheduler and cache knobs, validated like vLLM."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from router.sim.kv import LAYOUTS, Layout

SchedulingPolicy = Literal["fcfs", "priority"]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """One engine's settings. Field names follow vLLM's flags (`--max-num-seqs` → max_num_seqs).

    `max_num_partial_prefills` / `max_long_partial_prefills` model the limits vLLM had before
    0.27 (None = no limit, as current vLLM). `num_gpu_blocks` is the KV pool size that vLLM
    derives from memory at start-up; presets compute it for their hardware.
    """

    version: str = "0.32.0"
    max_model_len: int = 8192
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    long_prefill_token_threshold: int = 0
    stream_interval: int = 1
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    max_num_partial_prefills: int | None = None
    max_long_partial_prefills: int | None = None
    scheduling_policy: SchedulingPolicy = "fcfs"
    max_num_queued_reqs: int | None = None
    block_size: int = 16
    num_gpu_blocks: int = 4096
    kv_layout: Layout = "paged"

    def __post_init__(self) -> None:
        errors = self.errors()
        if errors:
            raise ValueError("; ".join(errors))

    def errors(self) -> list[str]:
        """Every rule vLLM enforces at start-up that this configuration breaks."""
        out: list[str] = []

        def need(ok: bool, message: str) -> None:
            if not ok:
                out.append(message)

        need(self.max_model_len >= 1, "max_model_len: must be ≥ 1")
        need(self.max_num_seqs >= 1, "max_num_seqs: must be ≥ 1")
        need(self.block_size >= 1, "block_size: must be ≥ 1")
        need(self.stream_interval >= 1, "stream_interval: must be ≥ 1")
        need(
            self.max_num_batched_tokens >= self.max_num_seqs,
            "max_num_batched_tokens: must be ≥ max_num_seqs",
        )
        need(
            self.enable_chunked_prefill or self.max_num_batched_tokens >= self.max_model_len,
            "max_num_batched_tokens: must be ≥ max_model_len when chunked prefill is off",
        )
        need(
            0 <= self.long_prefill_token_threshold <= self.max_model_len,
            "long_prefill_token_threshold: must be between 0 and max_model_len",
        )
        need(
            self.num_gpu_blocks * self.block_size >= self.max_model_len,
            "num_gpu_blocks: the KV cache must hold one max_model_len sequence",
        )
        need(self.scheduling_policy in ("fcfs", "priority"), "scheduling_policy: fcfs or priority")
        need(self.kv_layout in LAYOUTS, f"kv_layout: one of {', '.join(LAYOUTS)}")
        need(
            self.max_num_queued_reqs is None or self.max_num_queued_reqs >= 1,
            "max_num_queued_reqs: must be ≥ 1",
        )
        partial, long = self.max_num_partial_prefills, self.max_long_partial_prefills
        need(partial is None or partial >= 1, "max_num_partial_prefills: must be ≥ 1")
        need(long is None or long >= 1, "max_long_partial_prefills: must be ≥ 1")
        need(
            partial is None or long is None or long <= partial,
            "max_long_partial_prefills: must be ≤ max_num_partial_prefills",
        )
        return out

    @property
    def partial_prefill_limits(self) -> bool:
        return self.max_num_partial_prefills is not None

    @property
    def effective_long_prefill_threshold(self) -> int:
        """Per-request prefill chunk cap; with partial-prefill limits and no explicit value,
        vLLM used 4 % of max_model_len."""
        if self.long_prefill_token_threshold > 0:
            return self.long_prefill_token_threshold
        if (self.max_num_partial_prefills or 1) > 1:
            return max(1, int(self.max_model_len * 0.04))
        return 0

    def replace(self, **changes: Any) -> EngineConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> EngineConfig:
        """Build from a mapping such as a pool's `vllm:` block; unknown keys are ignored so
        that settings the simulator does not model (e.g. gpu_memory_utilization) pass through."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names and v is not None})

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
