"""Step-time model and presets.

One engine step costs

    t = c0 + c_prefill · prefill_tokens + c_decode · decode_seqs + c_ctx · attended_context_tokens
          + c_attn · prefill_attention_pairs

* c0 — the fixed cost of a forward pass: reading every weight once (memory bound) plus
  scheduling and launch overhead;
* c_prefill — compute per prompt token processed in the step;
* c_decode — per running sequence that produces a token (sampling, its share of the matmuls);
* c_ctx — reading the KV cache of each token attended to (context of every scheduled request);
* c_attn — attention compute per (prompt token, earlier token) pair of the prefill chunks in the
  step: a chunk of n tokens after c computed ones has n·c + n(n+1)/2 such pairs, so prefill
  time grows quadratically with the prompt where attention is compute bound (for the tiny model
  on a CPU it is most of a 2,000-token prefill). Decode attention is one pair per
  context token and stays in c_ctx.

The API server in front of the engine (`router.lab.sim.frontend`) is one event loop, modelled as a
single FIFO server: admitting a request takes `frontend_request_s + frontend_prompt_token_s ·
prompt_tokens` of its time (parsing, validation, tokenization, handing the request to the
engine), and every output token the engine emits takes `frontend_output_token_s` of it
(detokenizing, formatting and writing the stream event) before the client sees the token. So
busy decoding delays the admission of new requests and a burst of arrivals delays tokens.
`frontend_s` is latency taken in parallel on top (inter-process hops), before the engine sees a
request; it adds to time-to-first-token only.

Presets live in `router/lab/sim/presets/*.yaml` with their derivation; `lane-router sim calibrate`
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

from router.lab.sim.config import EngineConfig


def prefill_pairs(computed: int, chunk: int) -> int:
    """Causal attention pairs of a prefill chunk of `chunk` tokens after `computed` ones."""
    return chunk * computed + chunk * (chunk + 1) // 2


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    c0: float
    c_prefill: float
    c_decode: float
    c_ctx: float
    frontend_s: float = 0.0
    c_attn: float = 0.0
    frontend_request_s: float = 0.0
    frontend_prompt_token_s: float = 0.0
    frontend_output_token_s: float = 0.0

    def __post_init__(self) -> None:
        if min(dataclasses.astuple(self)) < 0:
            raise ValueError("step-time coefficients must be ≥ 0")

    def admission_cost(self, prompt_tokens: int) -> float:
        """Time of the API server's loop spent admitting one request."""
        return self.frontend_request_s + self.frontend_prompt_token_s * prompt_tokens

    def output_cost(self, tokens: int) -> float:
        """Time of the API server's loop spent passing `tokens` output tokens to clients."""
        return self.frontend_output_token_s * tokens

    def with_frontend(self, request_s: float, prompt_token_s: float, output_token_s: float) -> StepTimeModel:
        return dataclasses.replace(
            self,
            frontend_request_s=request_s,
            frontend_prompt_token_s=prompt_token_s,
            frontend_output_token_s=output_token_s,
        )

    def step_time(
        self, prefill_tokens: int, decode_seqs: int, attended_tokens: int, prefill_pairs: int = 0
    ) -> float:
        return (
            self.c0
            + self.c_prefill * prefill_tokens
            + self.c_decode * decode_seqs
            + self.c_ctx * attended_tokens
            + self.c_attn * prefill_pairs
        )

    def prefill_time(self, prompt_tokens: int) -> float:
        """One step that prefills a whole prompt of this length from scratch, nothing else."""
        return self.step_time(prompt_tokens, 0, prompt_tokens, prefill_pairs(0, prompt_tokens))

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
    folder = resources.files("router.lab.sim") / "presets"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_preset(name_or_path: str) -> Preset:
    """A packaged preset by name (e.g. ``cpu-tiny``) or a preset file by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        text = path.read_text()
    else:
        resource = resources.files("router.lab.sim") / "presets" / f"{name_or_path}.yaml"
        if not resource.is_file():
            known = ", ".join(preset_names())
            raise ValueError(f"unknown preset {name_or_path!r} (known: {known})")
        text = resource.read_text()
    data = yaml.safe_load(text)
    if not isinstance(data, Mapping):
        raise ValueError(f"preset {name_or_path!r} is not a mapping")
    return preset_from_mapping(data)
