"""Evidence transfer, or its refusal, across whole profiles: config A's record judged for A and B."""

from __future__ import annotations

from router.config.models import RequestClass
from router.config.vllm import server_configuration_hash
from router.evidence.decide import Decision
from router.evidence.profile import decide_profile
from router.evidence.targets import SloTargets
from tests.evidence.factories import MODEL, config_a, config_b, profile_a, profile_b, record_a


def _decisions(profile_b_side: bool, slo: SloTargets | None = None) -> dict[RequestClass, Decision]:
    cfg = profile_b() if profile_b_side else profile_a()
    return decide_profile(cfg, [record_a()], slo or SloTargets())


def test_config_a_passes_for_its_measured_slice() -> None:
    chat = _decisions(False)[RequestClass.CHAT]
    assert (chat.final_decision, chat.reason_class) == ("PASS", "within_measured_evidence")
    assert chat.record_id == record_a().record_id
    settings = config_a()
    assert (settings.tensor_parallel_size, settings.max_model_len, settings.max_num_seqs) == (1, 8192, 8)
    assert record_a().identity.server_configuration_hash == server_configuration_hash(settings, MODEL)


def test_config_a_lanes_without_limits_are_not_extrapolated_to() -> None:
    others = {cls: d for cls, d in _decisions(False).items() if cls is not RequestClass.CHAT}
    assert {d.reason_class for d in others.values()} == {"outside_measured_slice"}
    assert {d.triggers for d in others.values()} == {("request_shape",)}


def test_config_b_defers_until_measured() -> None:
    decisions = _decisions(True)
    chat = decisions[RequestClass.CHAT]
    assert (chat.final_decision, chat.reason_class, chat.retest_state) == (
        "DEFER",
        "configuration_changed",
        "required",
    )
    assert chat.triggers == ("config_hash", "parallelism", "max_model_len", "request_shape", "concurrency")
    assert {d.final_decision for d in decisions.values()} == {"DEFER"}
    settings = config_b()
    assert (settings.tensor_parallel_size, settings.max_model_len) == (2, 16384)


def test_a_stricter_product_slo_turns_config_a_down_too() -> None:
    chat = _decisions(False, SloTargets(p95_ttft_ms=500.0))[RequestClass.CHAT]
    assert (chat.final_decision, chat.slo_misses) == ("DEFER", ("p95_ttft",))
