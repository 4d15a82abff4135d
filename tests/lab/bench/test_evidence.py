from __future__ import annotations

from datetime import UTC, datetime

import pytest

from router.config.load import parse_profile
from router.config.models import RequestClass
from router.evidence import decide_profile, security_boundary_note, serving_configuration
from router.evidence.records import WarmupState
from router.evidence.targets import SloTargets
from router.lab.bench.outcome import Outcome
from router.lab.evidence.measure import Observed, as_observed, lane_records, peak_concurrency
from tests.lab.bench.lab import two_pools

URLS = ["http://127.0.0.1:9101", "http://127.0.0.1:9102", "http://127.0.0.1:9103"]
CFG = parse_profile(two_pools(URLS[:2], URLS[2:]))
WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def out(
    cls: str,
    lane: str,
    arrival: float,
    e2e: float,
    *,
    prompt: int = 100,
    tokens: int = 20,
    status: int = 200,
    error: str | None = None,
) -> Outcome:
    return Outcome(
        f"{cls}-{arrival}",
        cls,
        arrival,
        True,
        prompt_tokens=prompt,
        max_tokens=tokens,
        status=status,
        lane=lane,
        ttft=e2e / 4,
        gaps=[e2e / 40] * (tokens - 1),
        e2e=e2e,
        output_tokens=tokens if status == 200 else 0,
        error=error,
    )


def test_peak_concurrency_counts_overlapping_requests() -> None:
    spans = [out("chat", "chat", a, d) for a, d in [(0, 10), (1, 2), (2.5, 1), (3, 8), (20, 1)]]
    assert peak_concurrency(spans) == 3  # at 3.0: the first, the fourth and the third (2.5–3.5)
    assert peak_concurrency([out("chat", "chat", 0, 1), out("chat", "chat", 1, 1)]) == 1


def test_one_record_per_lane_with_its_slice_and_measurements() -> None:
    outcomes = [out("chat", "chat", i * 0.5, 1.0, prompt=100 + i) for i in range(30)]
    outcomes += [out("rag", "chat", 1.0, 2.0, prompt=3000)]  # a RAG request the router took for chat
    outcomes += [out("batch", "batch", i, 5.0, prompt=4000, tokens=300) for i in range(4)]
    outcomes += [out("batch", "batch", 9, 1.0, status=504, error="upstream timeout")]
    outcomes += [out("chat", None, 1.0, 1.0)]  # type: ignore[arg-type]  # no debug header: not attributed
    records = lane_records(
        CFG,
        outcomes,
        pools=dict(CFG.pools),
        workload=b"w",
        window=15.0,
        warmup=WarmupState.DONE,
        measured_at=WHEN,
    )
    assert set(records) == {"chat", "batch"}
    chat, batch = records["chat"], records["batch"]
    assert chat.identity.served_model_name == CFG.pools["interactive"].model
    assert (
        batch.identity.server_configuration_hash
        == serving_configuration(CFG.pools["bulk"]).identity.server_configuration_hash
    )
    assert chat.measured_slice.input_tokens.min == 100 and chat.measured_slice.input_tokens.max == 3000
    assert chat.measured_slice.class_mix["chat"] == pytest.approx(30 / 31)
    assert sum(chat.measured_slice.class_mix.values()) == pytest.approx(1.0, abs=1e-9)
    assert chat.measured_slice.concurrency == 3  # two chats overlap, and the RAG request
    assert chat.context.protocol.sample_count == 31 and chat.context.warmup is WarmupState.DONE
    assert chat.measurements.ttft.p95_ms == pytest.approx(250.0)  # 30 of 31 at 250 ms, one at 500
    assert (batch.measurements.error_count, batch.measurements.timeout_count) == (0, 1)
    assert batch.measurements.requests_per_s == pytest.approx(4 / 15.0)
    assert chat.security_boundary_note == security_boundary_note(CFG)
    assert chat.record_id != batch.record_id
    # The records judge the profile's lanes through the evidence decision.
    decisions = decide_profile(CFG, records.values(), SloTargets(min_output_tokens_per_s=None))
    assert decisions[RequestClass.CHAT].measurement_state.value == "qualified"
    assert set(decisions) == set(CFG.lanes)


def test_observed_identity_replaces_the_configured_one_when_backends_agree() -> None:
    pool = CFG.pools["interactive"]
    seen = as_observed(pool, [Observed("0.33.1", 4096), Observed("0.33.1", 4096)])
    assert seen.vllm.version == "0.33.1" and seen.vllm.max_model_len == 4096
    assert as_observed(pool, [Observed("0.33.1", None), Observed("0.32.0", None)]) == pool
