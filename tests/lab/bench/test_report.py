from __future__ import annotations

import math
from typing import Any

import pytest

from router.lab.bench.outcome import Outcome
from router.lab.bench.report import class_table, meets_slo, percentile, summarize
from router.lab.bench.workload import Slo, WorkloadSpec

WORKLOAD = WorkloadSpec.model_validate(
    {
        "name": "two",
        "classes": {
            "chat": {
                "share": 0.5,
                "prompt_tokens": {"dist": "fixed", "value": 10},
                "output_tokens": {"dist": "fixed", "value": 4},
                "slo": {"ttft_s": 1.0, "itl_s": 0.05},
            },
            "batch": {
                "share": 0.5,
                "stream": False,
                "prompt_tokens": {"dist": "fixed", "value": 10},
                "output_tokens": {"dist": "fixed", "value": 4},
                "slo": {"e2e_s": 10.0},
            },
        },
        "gate": {"min_attainment": 0.9, "per_class": {"batch": 0.5}},
    }
)


def out(
    cls: str,
    *,
    ttft: float = 0.1,
    gaps: tuple[float, ...] = (0.01, 0.01),
    e2e: float = 1.0,
    status: int = 200,
    error: str | None = None,
    arrival: float = 0.0,
    tokens: int = 4,
    **kw: Any,
) -> Outcome:
    return Outcome(
        f"{cls}-{arrival}",
        cls,
        arrival,
        cls == "chat",
        status=status,
        ttft=ttft,
        gaps=list(gaps),
        e2e=e2e,
        error=error,
        output_tokens=tokens,
        **kw,
    )


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50
    assert percentile(values, 95) == 95
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([3.0, 1.0, 2.0], 50) == 2
    assert percentile([7.0], 95) == 7
    assert math.isnan(percentile([], 50))


def test_p95_within_bound_iff_95_percent_within_bound() -> None:
    values = [0.5] * 95 + [2.0] * 5
    assert percentile(values, 95) <= 1.0
    assert percentile([0.5] * 94 + [2.0] * 6, 95) > 1.0


def test_meets_slo_checks_every_bound_and_success() -> None:
    slo = Slo(ttft_s=1.0, itl_s=0.05, e2e_s=5.0)
    assert meets_slo(out("chat"), slo)
    assert not meets_slo(out("chat", ttft=1.01), slo)
    assert not meets_slo(out("chat", e2e=5.5), slo)
    assert not meets_slo(out("chat", status=503), slo)
    assert not meets_slo(out("chat", error="stream ended without [DONE]"), slo)
    # ITL: the request's own p95 gap. 19 quick gaps and one slow one: p95 is quick.
    assert meets_slo(out("chat", gaps=(0.01,) * 19 + (0.5,)), slo)
    assert not meets_slo(out("chat", gaps=(0.01,) * 18 + (0.5, 0.5)), slo)
    assert meets_slo(out("chat", ttft=None, e2e=None), Slo())  # no bound, success is enough


def test_attainment_goodput_and_the_gate() -> None:
    chats = [out("chat", arrival=i) for i in range(9)] + [out("chat", ttft=3.0, arrival=9)]
    batches = [out("batch", e2e=2.0, arrival=i) for i in range(3)] + [
        out("batch", status=429, arrival=3, ttft=None, e2e=None, tokens=0),
        out("batch", e2e=30.0, arrival=4),
    ]
    stats = summarize(chats + batches, WORKLOAD, window=10.0)
    chat, batch = stats.classes["chat"], stats.classes["batch"]
    assert (chat.sent, chat.answered, chat.met) == (10, 10, 9)
    assert chat.attainment == pytest.approx(0.9) and chat.passed  # threshold 0.9
    assert (batch.sent, batch.answered, batch.met) == (5, 4, 3)
    assert batch.attainment == pytest.approx(0.6) and batch.passed  # its own threshold 0.5
    assert batch.accepted_share == pytest.approx(0.8)
    assert stats.goodput == pytest.approx(12 / 10.0)
    assert chat.goodput == pytest.approx(0.9)
    assert stats.passed and stats.failing() == []
    assert chat.ttft.p50 == pytest.approx(0.1) and chat.ttft.p99 == pytest.approx(3.0)
    assert stats.output_tokens_per_s == pytest.approx((10 + 4) * 4 / 34.0)  # last answer at 4 + 30
    worse = summarize(
        [*chats[:8], out("chat", e2e=None, status=0, error="timeout"), out("chat", ttft=2.0), *batches],
        WORKLOAD,
        window=10.0,
    )
    assert not worse.passed and worse.failing() == ["chat"]
    assert "FAIL" in class_table(worse) and "| chat | 10 |" in class_table(worse)


def test_a_class_without_requests_does_not_decide_the_gate() -> None:
    stats = summarize([out("chat")], WORKLOAD, window=1.0)
    assert stats.classes["batch"].sent == 0
    assert stats.passed
    assert not summarize([], WORKLOAD, window=1.0).passed
