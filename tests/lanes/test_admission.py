"""Admission rules, pure: prefill limits per backend, the long-prompt threshold, the pick among
backends with room."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from router.balance.least_outstanding import LeastOutstanding
from router.balance.prefix_affinity import PrefixAffinity
from router.config.models import DEFAULT_LONG_PROMPT_TOKENS, PoolAdmission, PoolConfig
from router.config.vllm import VllmSettings
from router.lanes.admission import PrefillLimits, choose_backend, lane_has_room


@dataclass(frozen=True)
class B:
    name: str
    in_flight: int = 0
    prefilling: int = 0
    long_prefilling: int = 0
    load_score: float = 0.0


def pool_config(admission: PoolAdmission, threshold: int = 0) -> PoolConfig:
    return PoolConfig(
        backends=["http://127.0.0.1:8101"],
        model="m",
        vllm=VllmSettings(long_prefill_token_threshold=threshold),
        admission=admission,
    )


def test_long_threshold_defaults_to_the_pools_vllm_threshold_then_a_constant() -> None:
    explicit = PrefillLimits.for_pool(pool_config(PoolAdmission(long_prompt_tokens=700), threshold=512))
    from_vllm = PrefillLimits.for_pool(pool_config(PoolAdmission(), threshold=512))
    fallback = PrefillLimits.for_pool(pool_config(PoolAdmission(), threshold=0))

    assert explicit.long_prompt_tokens == 700
    assert from_vllm.long_prompt_tokens == 512
    assert fallback.long_prompt_tokens == DEFAULT_LONG_PROMPT_TOKENS == 1024


def test_long_means_strictly_above_the_threshold() -> None:
    limits = PrefillLimits(long_prompt_tokens=1024)

    assert not limits.is_long(1024)
    assert limits.is_long(1025)


def test_without_limits_every_backend_has_room() -> None:
    limits = PrefillLimits()
    busy = B("a", prefilling=10_000, long_prefilling=10_000)

    assert not limits.enabled
    assert limits.has_room(busy, long=True)
    assert limits.has_room(busy, long=False)


def test_room_for_short_and_long_prompts() -> None:
    limits = PrefillLimits(max_prefilling=4, max_long_prefilling=2)

    assert limits.has_room(B("a", prefilling=3, long_prefilling=1), long=True)
    assert not limits.has_room(B("a", prefilling=3, long_prefilling=2), long=True)
    assert limits.has_room(B("a", prefilling=3, long_prefilling=2), long=False)
    assert not limits.has_room(B("a", prefilling=4, long_prefilling=0), long=False)


def test_zero_long_prefills_refuses_long_prompts_only() -> None:
    limits = PrefillLimits(max_prefilling=4, max_long_prefilling=0)

    assert limits.refuses(long=True)
    assert not limits.refuses(long=False)
    assert not PrefillLimits(max_prefilling=4, max_long_prefilling=1).refuses(long=True)


def test_blind_hold_is_the_prefill_estimate_when_the_pool_gives_a_rate() -> None:
    assert PrefillLimits(prefill_tokens_per_s=10_000).blind_hold_s(5000) == 0.5
    assert PrefillLimits().blind_hold_s(5000) is None


def test_lane_room() -> None:
    assert lane_has_room(100, None)
    assert lane_has_room(1, 2)
    assert not lane_has_room(2, 2)


def test_choose_backend_skips_backends_without_room() -> None:
    limits = PrefillLimits(max_prefilling=2, max_long_prefilling=1)
    backends = [B("a", in_flight=0, prefilling=2), B("b", in_flight=5, prefilling=1, long_prefilling=1)]

    # `a` is the least loaded but full; `b` still takes a short prompt, not a long one.
    assert choose_backend(backends, limits, False, LeastOutstanding(), None) is backends[1]
    assert choose_backend(backends, limits, True, LeastOutstanding(), None) is None


def test_choose_backend_keeps_prefix_affinity_among_backends_with_room() -> None:
    limits = PrefillLimits(max_prefilling=2)
    backends = [B(f"http://10.0.0.{i}:8000") for i in range(4)]
    fp = b"fingerprint"
    preferred = PrefixAffinity.preferred(backends, fp)
    with_full_preferred = [replace(b, prefilling=2) if b is preferred else b for b in backends]

    assert choose_backend(backends, limits, False, PrefixAffinity(), fp) is preferred
    other = choose_backend(with_full_preferred, limits, False, PrefixAffinity(), fp)
    assert other is not None and other.name != preferred.name


@settings(max_examples=200, deadline=None)
@given(
    n_backends=st.integers(1, 5),
    max_prefilling=st.integers(2, 10),
    data=st.data(),
)
def test_long_prompts_alone_never_leave_a_short_prompt_without_room(
    n_backends: int, max_prefilling: int, data: st.DataObject
) -> None:
    """The source's chunked-prefill rule: however many long prompts arrive, a short one can
    always start, because long ones may fill at most max_long_prefilling < max_prefilling."""
    max_long = data.draw(st.integers(1, max_prefilling - 1))
    limits = PrefillLimits(max_prefilling=max_prefilling, max_long_prefilling=max_long)
    backends = [B(f"b{i}") for i in range(n_backends)]
    for _ in range(data.draw(st.integers(0, 60))):
        chosen = choose_backend(backends, limits, True, LeastOutstanding(), None)
        if chosen is None:
            break
        backends = [
            replace(
                b,
                in_flight=b.in_flight + 1,
                prefilling=b.prefilling + 1,
                long_prefilling=b.long_prefilling + 1,
            )
            if b is chosen
            else b
            for b in backends
        ]

    assert all(b.long_prefilling <= max_long for b in backends)
    assert choose_backend(backends, limits, False, LeastOutstanding(), None) is not None
