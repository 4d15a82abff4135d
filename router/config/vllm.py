"""A pool's vLLM server configuration: one model of vLLM's settings and start-up rules, hashed
for evidence.

`VllmCapacity` holds every setting that bounds capacity — the knobs an evidence record states
(router/evidence/records.py `CapacityKnobs`) — and `VllmSettings`, a pool's `vllm:` block, adds
what identifies the server beyond them. The simulator's engine configuration
(router/lab/sim/config.py `EngineConfig`) extends `VllmSettings` with what the simulator alone
needs. Field constraints live on the fields; the rules that relate several fields are the
functions below, so each is stated once for the profile, the records and the simulator.

`server_configuration_hash` is the identity that capacity evidence records are bound to
(docs/evidence.md): the sha256 of the canonical JSON of every *effective* capacity-relevant
setting, defaults resolved, so two spellings of the same configuration hash alike and any
decisive change hashes differently.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

# vLLM 0.27 removed --max-num-partial-prefills / --max-long-partial-prefills; on newer versions the
# router's own per-backend admission (max_prefilling / max_long_prefilling) enforces that rule.
PARTIAL_PREFILL_REMOVED_IN = (0, 27)
PARTIAL_PREFILL_FLAGS = ("max_num_partial_prefills", "max_long_partial_prefills")
# Set by whoever starts the server (the deployment renderer, the test launcher), never by a pool.
LAUNCHER_FLAGS = frozenset({"--model", "--revision", "--host", "--port", "--api-key", "--served-model-name"})

Issue = tuple[str, str]  # (field, message)


def parse_version(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in text.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


class VllmRelease(BaseModel):
    """Which vLLM serves which weights: what names the server beyond its capacity settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str = "0.32.0"
    model_revision: str | None = None


class VllmCapacity(BaseModel):
    """Every setting of a vLLM server that bounds its capacity."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_model_len: int = Field(8192, ge=16)
    max_num_batched_tokens: int = Field(2048, ge=1)
    max_num_seqs: int = Field(256, ge=1)
    long_prefill_token_threshold: int = Field(0, ge=0)
    stream_interval: int = Field(1, ge=1)
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    max_num_partial_prefills: int | None = Field(None, ge=1)
    max_long_partial_prefills: int | None = Field(None, ge=1)
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    max_num_queued_reqs: int | None = Field(None, ge=1)
    max_num_queued_tokens: int | None = Field(None, ge=1)
    max_num_active_seqs: int | None = Field(None, ge=1)
    block_size: int = Field(16, ge=1)
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    data_parallel_size: int = Field(1, ge=1)
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    # Left out of a dump when empty, so evidence records of servers started without extra
    # arguments keep the content — and the record id — they always had.
    extra_args: tuple[str, ...] = Field((), exclude_if=lambda args: not args)


class VllmSettings(VllmCapacity, VllmRelease):
    """The `vllm:` block of a pool: what `vllm serve` is started with, and which server that is
    (fields in the order the block is written: release, capacity, hardware)."""

    hardware_profile: str | None = None

    @property
    def version_tuple(self) -> tuple[int, ...]:
        return parse_version(self.version)

    @property
    def has_partial_prefill_flags(self) -> bool:
        return self.version_tuple < PARTIAL_PREFILL_REMOVED_IN

    def capacity_settings(self, served_model: str) -> dict[str, Any]:
        """Every setting that bounds capacity, with defaults resolved (what vLLM will really run)."""
        settings = self.model_dump(mode="json", exclude={"hardware_profile"})
        settings["served_model"] = served_model
        settings["extra_args"] = list(self.extra_args)
        if not self.has_partial_prefill_flags:
            for name in PARTIAL_PREFILL_FLAGS:
                settings.pop(name)
        return settings


def server_configuration_hash(settings: VllmSettings, served_model: str) -> str:
    canonical = orjson.dumps(settings.capacity_settings(served_model), option=orjson.OPT_SORT_KEYS)
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def vllm_rule_violations(v: VllmSettings) -> list[Issue]:
    """vLLM's own start-up validation, mirrored: (field, message) pairs; empty when vLLM would start.
    A flag the version no longer has is reported as such, not also by the rules that bound it."""
    refused = flag_violations(v)
    named = {name for name, _ in refused}
    return [issue for issue in engine_rule_violations(v) if issue[0] not in named] + refused


def engine_rule_violations(v: VllmCapacity) -> list[Issue]:
    """The rules that relate the engine's limits to each other, whatever version takes them."""
    issues: list[Issue] = []
    if not v.enable_chunked_prefill and v.max_num_batched_tokens < v.max_model_len:
        issues.append(
            (
                "max_num_batched_tokens",
                f"must be ≥ max_model_len ({v.max_model_len}) when chunked prefill is off",
            )
        )
    if v.max_num_batched_tokens < v.max_num_seqs:
        issues.append(("max_num_batched_tokens", f"must be ≥ max_num_seqs ({v.max_num_seqs})"))
    if v.long_prefill_token_threshold > v.max_model_len:
        issues.append(("long_prefill_token_threshold", f"must be ≤ max_model_len ({v.max_model_len})"))
    if v.max_num_active_seqs is not None and v.max_num_active_seqs > v.max_num_seqs:
        issues.append(("max_num_active_seqs", f"must be ≤ max_num_seqs ({v.max_num_seqs})"))
    total, long = v.max_num_partial_prefills, v.max_long_partial_prefills
    if total is not None and total > 1 and not v.enable_chunked_prefill:
        issues.append(("max_num_partial_prefills", "> 1 needs enable_chunked_prefill"))
    if total is not None and long is not None and long > total:
        issues.append(("max_long_partial_prefills", f"must be ≤ max_num_partial_prefills ({total})"))
    return issues


def flag_violations(v: VllmSettings) -> list[Issue]:
    """Flags this version of `vllm serve` does not take from a pool: removed ones, and those the
    launcher sets."""
    issues: list[Issue] = []
    if not v.has_partial_prefill_flags:
        issues += [
            (
                name,
                f"removed in vLLM 0.27 (version is {v.version}); "
                "use the pool's admission.max_prefilling / max_long_prefilling instead",
            )
            for name in PARTIAL_PREFILL_FLAGS
            if getattr(v, name) is not None
        ]
    owned = sorted({a.split("=")[0] for a in v.extra_args} & LAUNCHER_FLAGS)
    if owned:
        issues.append(("extra_args", f"{', '.join(owned)} belong to the launcher, not the pool settings"))
    return issues
