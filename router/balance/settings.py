"""A lane's `balance:` block: one settings model per strategy, validated when a profile loads and
read when a lane's balancer is built. They sit apart from the strategies' modules because those
are compiled with the request path, which a pydantic model cannot be (docs/compiled.md); each
strategy's module names its model in its `STRATEGY` (router/balance/registry.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer


class StrategySettings(BaseModel):
    """A lane's `balance:` block. Each strategy's own model narrows `strategy` to its name (the
    tag of the union the lane config validates against) and adds the settings it takes. A block
    that holds nothing but the name is written back as the name (`balance: round_robin`), as a
    profile spells it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    strategy: str

    @model_serializer(mode="wrap")
    def _plain_when_bare(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        return self.strategy if isinstance(data, dict) and data.keys() == {"strategy"} else data


class LeastOutstandingSettings(StrategySettings):
    strategy: Literal["least_outstanding"] = "least_outstanding"


class RoundRobinSettings(StrategySettings):
    strategy: Literal["round_robin"] = "round_robin"


class PowerOfTwoSettings(StrategySettings):
    strategy: Literal["power_of_two"] = "power_of_two"


class LeastLoadSettings(StrategySettings):
    strategy: Literal["least_load"] = "least_load"


class PrefixAffinitySettings(StrategySettings):
    """`affinity: prefix` (RAG) keys on the prompt's leading `min_tokens` (default: the profile's
    `classify.repeated_prefix.min_tokens`), the shared document. `affinity: session` (agent loops)
    keys on `X-Session-Id`, else the body's `user`, else the prompt itself, so an agent's growing
    context stays on one backend. `slack`: a backend above (1 + slack) × the pool's mean
    in-flight load is passed over for the next in rank."""

    strategy: Literal["prefix_affinity"] = "prefix_affinity"
    affinity: Literal["prefix", "session"] = "prefix"
    min_tokens: int | None = Field(None, ge=1)
    slack: float = Field(1.0, ge=0)


class PrecisePrefixSettings(StrategySettings):
    """`precise_prefix` places a request on the backend whose engine holds the most of its
    prompt's leading tokens, as the engines' KV cache events report them (the pool's
    `kv_events:`), less `penalty` tokens per request the backend has in flight, within the load
    bound `slack` (as `prefix_affinity`). A backend whose event stream is silent or lost is judged
    as `prefix_affinity` would judge it, keyed on the prompt's leading `min_tokens`."""

    strategy: Literal["precise_prefix"] = "precise_prefix"
    min_tokens: int | None = Field(None, ge=1)
    slack: float = Field(1.0, ge=0)
    penalty: float = Field(256.0, ge=0)
