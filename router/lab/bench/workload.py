"""The mixed-traffic workload file: which request classes arrive, in what shares and shapes, and
the service level each class expects. YAML → validated `WorkloadSpec`, or every problem with its
dotted path (the profile loader's `ConfigError` style).

Token counts are prompt/output lengths as the router estimates them (≈4 characters per token);
the generator writes text of exactly that many characters per token.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from router.config.checks import ConfigIssue
from router.config.load import ConfigError, dotted, read_yaml
from router.config.models import RequestClass

SHARE_TOLERANCE = 1e-6


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TokenDist(Strict):
    """A token count: `uniform` in [min, max], `lognormal` around `median` (truncated to
    [min, max] by redrawing), or `fixed` at `value`."""

    dist: Literal["uniform", "lognormal", "fixed"] = "uniform"
    min: int = Field(1, ge=1)
    max: int = Field(1, ge=1)
    median: float | None = Field(None, gt=0)
    sigma: float = Field(0.7, gt=0)
    value: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> TokenDist:
        if self.dist == "fixed":
            if self.value is None:
                raise ValueError("a fixed distribution needs `value`")
            return self
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be ≤ max ({self.max})")
        if self.dist == "lognormal" and (self.median is None or not self.min <= self.median <= self.max):
            raise ValueError("a lognormal distribution needs `median` between min and max")
        return self

    @property
    def low(self) -> int:
        return self.value if self.dist == "fixed" and self.value is not None else self.min

    @property
    def high(self) -> int:
        return self.value if self.dist == "fixed" and self.value is not None else self.max

    @property
    def mean(self) -> float:
        """The expected value (for the lognormal, of the untruncated law, clamped to the range)."""
        if self.dist == "fixed":
            return float(self.low)
        if self.dist == "uniform":
            return (self.min + self.max) / 2
        assert self.median is not None
        return min(self.max, max(self.min, self.median * math.exp(self.sigma**2 / 2)))


class FloatRange(Strict):
    min: float = Field(ge=0)
    max: float = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> FloatRange:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be ≤ max ({self.max})")
        return self


class Documents(Strict):
    """A fixed corpus that prompts repeat as a prefix; popularity follows Zipf(`zipf`).
    `instructions`: tokens of a system prompt every request sends before its document."""

    count: int = Field(ge=1)
    tokens: int = Field(ge=1)
    zipf: float = Field(1.1, ge=0)
    instructions: int = Field(0, ge=0)


class Session(Strict):
    """A multi-step tool loop: each step re-sends the whole context plus the last tool result;
    the next step is sent `think_s` after the previous answer arrived."""

    steps: TokenDist
    initial_tokens: TokenDist
    step_tokens: TokenDist
    think_s: FloatRange
    tools: int = Field(3, ge=1, le=64)


class SlowReaders(Strict):
    """A fixed population of client identities that read streams slowly from the socket."""

    clients: int = Field(ge=1)
    tokens_per_s: FloatRange


class Slo(Strict):
    """Per-request bounds; a request meets its class SLO when it succeeded and every bound set
    holds. `itl_s` bounds the request's own `itl_percentile` inter-token gap."""

    ttft_s: float | None = Field(None, gt=0)
    itl_s: float | None = Field(None, gt=0)
    itl_percentile: float = Field(95.0, gt=0, le=100)
    e2e_s: float | None = Field(None, gt=0)


class ClassSpec(Strict):
    share: float = Field(gt=0, le=1)
    stream: bool = True
    prompt_tokens: TokenDist | None = None
    documents: Documents | None = None
    question_tokens: TokenDist | None = None
    session: Session | None = None
    output_tokens: TokenDist
    slow_readers: SlowReaders | None = None
    clients: int = Field(100, ge=1)
    slo: Slo = Slo()

    @model_validator(mode="after")
    def _one_prompt_shape(self) -> ClassSpec:
        shapes = [
            name
            for name, present in (
                ("prompt_tokens", self.prompt_tokens is not None),
                ("documents", self.documents is not None),
                ("session", self.session is not None),
            )
            if present
        ]
        if len(shapes) != 1:
            raise ValueError(
                "give exactly one prompt shape: prompt_tokens, documents (+ question_tokens) or session"
            )
        if self.documents is not None and self.question_tokens is None:
            raise ValueError("documents need question_tokens")
        if self.slow_readers is not None and not self.stream:
            raise ValueError("slow_readers read a stream: set stream: true")
        return self

    @property
    def mean_steps(self) -> float:
        return self.session.steps.mean if self.session is not None else 1.0

    def max_prompt_tokens(self) -> int:
        if self.prompt_tokens is not None:
            return self.prompt_tokens.high
        if self.documents is not None and self.question_tokens is not None:
            return self.documents.instructions + self.documents.tokens + self.question_tokens.high
        assert self.session is not None
        s = self.session
        turns = s.steps.high - 1
        return s.initial_tokens.high + turns * (s.step_tokens.high + self.output_tokens.high)


class Gate(Strict):
    """A profile passes when every class meets its SLO for at least `min_attainment` of its
    requests (a class may set its own)."""

    min_attainment: float = Field(0.95, gt=0, le=1)
    per_class: dict[RequestClass, float] = Field(default_factory=dict)

    def threshold(self, cls: str) -> float:
        for key, value in self.per_class.items():
            if key.value == cls:
                return value
        return self.min_attainment


class Bursts(Strict):
    """Arrivals only in the first `duty` share of every `period_s`, at the rate that keeps the
    tenant's mean (a tenant that floods in bursts)."""

    period_s: float = Field(gt=0)
    duty: float = Field(gt=0, le=1)

    def at(self, on_time: float) -> float:
        """The time of the moment `on_time` seconds into the bursts."""
        span = self.period_s * self.duty
        k = math.floor(on_time / span)
        return k * self.period_s + (on_time - k * span)


class TenantSpec(Strict):
    """One tenant (one API key): its part of the load — a `share` of the offered rate or its own
    `rate` — its key's `weight` and `tier`, and optionally its own class mix (`classes`: shares
    of the workload's classes), answer lengths and SLO in place of its classes'."""

    name: str = Field(min_length=1)
    share: float | None = Field(None, gt=0, le=1)
    rate: float | None = Field(None, gt=0)
    weight: float = Field(1.0, gt=0, le=1000)
    tier: int = Field(0, ge=0, le=100)
    bursts: Bursts | None = None
    classes: dict[RequestClass, float] | None = None
    output_tokens: TokenDist | None = None
    slo: Slo | None = None

    @model_validator(mode="after")
    def _one_rate(self) -> TenantSpec:
        if (self.share is None) == (self.rate is None):
            raise ValueError("give exactly one of share (of the offered rate) or rate (requests/s)")
        return self

    def rate_at(self, offered: float) -> float:
        return self.rate if self.rate is not None else offered * (self.share or 0.0)


class WorkloadSpec(Strict):
    name: str = Field(min_length=1)
    description: str = ""
    seed: int = 0
    model: str | None = None
    classes: dict[RequestClass, ClassSpec] = Field(min_length=1)
    tenants: tuple[TenantSpec, ...] = ()
    gate: Gate = Gate()

    @model_validator(mode="after")
    def _shares_add_up(self) -> WorkloadSpec:
        total = sum(c.share for c in self.classes.values())
        if abs(total - 1.0) > SHARE_TOLERANCE:
            raise ValueError(f"class shares must add up to 1, got {total:g}")
        return self

    def class_names(self) -> list[str]:
        return [cls.value for cls in self.classes]

    def spec(self, cls: str) -> ClassSpec:
        return self.classes[RequestClass(cls)]

    def tenant(self, name: str) -> TenantSpec:
        return next(t for t in self.tenants if t.name == name)

    def tenant_classes(self, tenant: TenantSpec) -> dict[str, float]:
        """The tenant's class mix: its own, else the workload's shares."""
        if tenant.classes is not None:
            return {cls.value: share for cls, share in tenant.classes.items()}
        return {cls.value: spec.share for cls, spec in self.classes.items()}

    def slo_of(self, cls: str, tenant: str = "") -> Slo:
        """The SLO a request of `cls` sent by `tenant` is held to: the tenant's, else the class's."""
        own = self.tenant(tenant).slo if tenant and self.tenants else None
        return own if own is not None else self.spec(cls).slo


def tenant_issues(spec: WorkloadSpec) -> list[ConfigIssue]:
    """What the tenants say that the workload contradicts: a name twice, a class the workload
    does not have, class shares or tenant shares that do not add up to 1."""
    issues: list[ConfigIssue] = []
    seen: set[str] = set()
    for i, tenant in enumerate(spec.tenants):
        at = f"tenants[{i}]"
        if tenant.name in seen:
            issues.append(ConfigIssue(f"{at}.name", f"tenant {tenant.name!r} is named twice"))
        seen.add(tenant.name)
        if tenant.classes is None:
            continue
        for cls, share in tenant.classes.items():
            if cls not in spec.classes:
                issues.append(ConfigIssue(f"{at}.classes.{cls.value}", "not a class of this workload"))
            elif share <= 0:
                issues.append(ConfigIssue(f"{at}.classes.{cls.value}", "must be > 0"))
        total = sum(tenant.classes.values())
        if abs(total - 1.0) > SHARE_TOLERANCE:
            issues.append(ConfigIssue(f"{at}.classes", f"class shares must add up to 1, got {total:g}"))
    shares = [t.share for t in spec.tenants if t.share is not None]
    if shares and abs(sum(shares) - 1.0) > SHARE_TOLERANCE:
        issues.append(ConfigIssue("tenants", f"tenant shares must add up to 1, got {sum(shares):g}"))
    return issues


_PHRASES = {
    "greater_than_equal": "must be ≥ {ge}",
    "greater_than": "must be > {gt}",
    "less_than_equal": "must be ≤ {le}",
    "missing": "required",
    "extra_forbidden": "unknown key",
}


def _issue(err: Mapping[str, Any]) -> ConfigIssue:
    phrase = _PHRASES.get(str(err["type"]))
    ctx = {k: f"{v:g}" if isinstance(v, float) else v for k, v in err.get("ctx", {}).items()}
    message = phrase.format(**ctx) if phrase else str(err["msg"])
    return ConfigIssue(dotted(list(err["loc"])), message.removeprefix("Value error, "))


def parse_workload(data: Any, source: str = "<workload>") -> WorkloadSpec:
    if not isinstance(data, dict):
        raise ConfigError(source, [ConfigIssue("(top level)", "must be a mapping")])
    try:
        spec = WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, [_issue(e) for e in exc.errors(include_url=False)]) from None
    issues = tenant_issues(spec)
    if issues:
        raise ConfigError(source, issues)
    return spec


def load_workload(path: str | Path) -> WorkloadSpec:
    return parse_workload(read_yaml(path), str(path))
