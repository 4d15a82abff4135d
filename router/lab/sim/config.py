"""The simulated engine's configuration: a pool's vLLM settings, plus what vLLM derives at
start-up and the simulator's own choice of KV layout.

The fields and the rules relating them are those of router/config/vllm.py, so a flag added
there reaches the simulator without a change here. The simulator takes every flag vLLM ever
had, whatever version it reports: `max_num_partial_prefills` / `max_long_partial_prefills`
model the limits vLLM had before 0.27 (None = no limit, as current vLLM). `num_gpu_blocks` is
the KV pool size that vLLM derives from memory at start-up; presets compute it for their hardware.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from pydantic import Field, model_validator

from router.config.vllm import VllmSettings, engine_rule_violations
from router.lab.sim.kv import Layout


class EngineConfig(VllmSettings):
    """One engine's settings. Field names follow vLLM's flags (`--max-num-seqs` → max_num_seqs)."""

    num_gpu_blocks: int = Field(4096, ge=1)
    kv_layout: Layout = "paged"

    @model_validator(mode="after")
    def _starts(self) -> Self:
        problems = [f"{field}: {message}" for field, message in engine_rule_violations(self)]
        if self.num_gpu_blocks * self.block_size < self.max_model_len:
            problems.append("num_gpu_blocks: the KV cache must hold one max_model_len sequence")
        if problems:
            raise ValueError("; ".join(problems))
        return self

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
        return EngineConfig.model_validate({**self.as_dict(), **changes})

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> EngineConfig:
        """Build from a mapping such as a pool's `vllm:` block; keys the engine does not know are
        ignored, and None stands for the default."""
        return cls.model_validate(
            {k: v for k, v in values.items() if k in cls.model_fields and v is not None}
        )

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
