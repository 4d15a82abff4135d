"""Step-time model and presets.

One engine step costs

    t = c0 + c_prefill · prefill_tokens + c_decode · decode_seqs + c_ctx · attended_context_tokens

* c0 — the fixed cost of a forward pass: reading every weight once (memory bound) plus
  scheduling and launch overhead;
* c_prefill — compute per prompt token processed in the step;
* c_decode — per running sequence that produces a token (sampling, its share of the matmuls);
* c_ctx — reading the KV cache of each token attended to (context of every scheduled request).

`frontend_s` is the latency a request spends in the API server before the engine sees it
(parsing, chat template, tokenization, IPC); it adds to time-to-first-token only.

Presets live in `router/sim/presets/*.yaml` with their derivation; `lane-router sim calibrate`
fits the coefficients against a running vLLM and writes a new preset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from router.sim.config import EngineConfig


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    c0: float
    c_prefill: float
    c_decode: float
    c_ctx: float
    frontend_s: float = 0.0

    def __post_init__(self) -> None:
        if min(self.c0, self.c_prefill, self.c_decode, self.c_ctx, self.frontend_s) < 0:
            raise ValueError("step-time coefficients must be ≥ 0")

    def step_time(self, prefill_tokens: int, decode_seqs: int, attended_tokens: int) -> float:
        return (
            self.c0
            + self.c_prefill * prefill_tokens
            + self.c_decode * decode_seqs
            + self.c_ctx * attended_tokens
        )

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    description: str
    model: str
    timing: StepTimeModel
    engine: EngineConfig

    def to_yaml(self) -> str:
        data = {
            "name": self.name,
            "description": self.description,
            "model": self.model,
            "timing": self.timing.as_dict(),
            "engine": self.engine.as_dict(),
        }
        return yaml.safe_dump(data, sort_keys=False)


def preset_from_mapping(data: Mapping[str, Any]) -> Preset:
    timing = data.get("timing")
    engine = data.get("engine") or {}
    if not isinstance(timing, Mapping) or not isinstance(engine, Mapping):
        raise ValueError("a preset needs a `timing` mapping and an `engine` mapping")
    return Preset(
        name=str(data.get("name", "unnamed")),
        description=str(data.get("description", "")).strip(),
        model=str(data.get("model", "sim-model")),
        timing=StepTimeModel(**{k: float(v) for k, v in timing.items()}),
        engine=EngineConfig.from_mapping(engine),
    )


def preset_names() -> list[str]:
    folder = resources.files("router.sim") / "presets"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_preset(name_or_path: str) -> Preset:
    """A packaged preset by name (e.g. ``cpu-tiny``) or a preset file by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        text = path.read_text()
    else:
        resource = resources.files("router.sim") / "presets" / f"{name_or_path}.yaml"
        if not resource.is_file():
            known = ", ".join(preset_names())
            raise ValueError(f"unknown preset {name_or_path!r} (known: {known})")
        text = resource.read_text()
    data = yaml.safe_load(text)
    if not isinstance(data, Mapping):
        raise ValueError(f"preset {name_or_path!r} is not a mapping")
    return preset_from_mapping(data)
