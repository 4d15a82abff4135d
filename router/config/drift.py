"""Drift: what a live vLLM server says that contradicts its pool's profile. Pure.

The router compares the server's `/version` with the pool's `vllm.version`, and its `/v1/models`
with the pool's model (and the LoRA adapters it lists) and `vllm.max_model_len`. Each difference
is one `Drift`, naming the field, the profile's value and the live one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from router.config.models import PoolConfig


@dataclass(frozen=True, slots=True)
class Drift:
    field: str  # as the pool's block spells it: vllm.version, model, adapters, vllm.max_model_len
    profile: str
    live: str

    def __str__(self) -> str:
        return f"{self.field}: profile {self.profile}, live {self.live}"


def served_entries(models: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """`/v1/models`' entries by name."""
    if models is None or not isinstance(models.get("data"), list):
        return {}
    return {str(m["id"]): m for m in models["data"] if isinstance(m, dict) and "id" in m}


def served_adapters(entries: dict[str, dict[str, Any]]) -> tuple[tuple[str, str], ...]:
    """The LoRA adapters among `/v1/models`' entries, each with its parent (the base model's
    served name): vLLM lists an adapter with `parent` set, a base model without."""
    found = []
    for name, entry in entries.items():
        parent = entry.get("parent")
        if isinstance(parent, str) and parent and parent != name:
            found.append((name, parent))
    return tuple(sorted(found))


def live_max_model_len(pool: PoolConfig, models: dict[str, Any] | None) -> int | None:
    """The context length the server states for the pool's model, if it states one."""
    entry = served_entries(models).get(pool.model)
    length = entry.get("max_model_len") if entry is not None else None
    return length if isinstance(length, int) and not isinstance(length, bool) else None


def drift_of(pool: PoolConfig, version: str | None, models: dict[str, Any] | None) -> tuple[Drift, ...]:
    """Every difference between the pool's profile and what its server answered (None: no
    usable answer, nothing to compare)."""
    found: list[Drift] = []
    declared = pool.vllm
    if version is not None and version != declared.version:
        found.append(Drift("vllm.version", declared.version, version))
    if models is None:
        return tuple(found)
    entries = served_entries(models)
    if pool.model not in entries:
        found.append(Drift("model", repr(pool.model), f"not served (serves {sorted(entries)})"))
        return tuple(found)
    # Adapters with a path are the router's to load: not served until a request asks for one.
    missing = [name for name in pool.adapters if name not in entries and name not in pool.adapter_paths]
    if missing:
        found.append(Drift("adapters", repr(list(pool.adapters)), f"{missing} not served"))
    live = live_max_model_len(pool, models)
    if live is not None and live != declared.max_model_len:
        found.append(Drift("vllm.max_model_len", str(declared.max_model_len), str(live)))
    return tuple(found)
