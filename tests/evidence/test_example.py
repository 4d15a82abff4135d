from __future__ import annotations

from router.config.models import RequestClass
from router.config.vllm import server_configuration_hash
from router.evidence.example import MODEL, config_a, config_b, worked_example
from router.evidence.targets import SloTargets


def test_config_a_passes_for_its_measured_slice() -> None:
    example = worked_example()
    chat = example.decisions_a[RequestClass.CHAT]
    assert (chat.final_decision, chat.reason_class) == ("PASS", "within_measured_evidence")
    assert chat.record_id == example.record.record_id
    settings = config_a()
    assert (settings.tensor_parallel_size, settings.max_model_len, settings.max_num_seqs) == (1, 8192, 8)
    assert example.record.identity.server_configuration_hash == server_configuration_hash(settings, MODEL)


def test_config_a_lanes_without_limits_are_not_extrapolated_to() -> None:
    example = worked_example()
    others = {cls: d for cls, d in example.decisions_a.items() if cls is not RequestClass.CHAT}
    assert {d.reason_class for d in others.values()} == {"outside_measured_slice"}
    assert {d.triggers for d in others.values()} == {("request_shape",)}


def test_config_b_defers_until_measured() -> None:
    example = worked_example()
    chat = example.decisions_b[RequestClass.CHAT]
    assert (chat.final_decision, chat.reason_class, chat.retest_state) == (
        "DEFER",
        "configuration_changed",
        "required",
    )
    assert chat.triggers == ("config_hash", "parallelism", "max_model_len", "request_shape", "concurrency")
    assert {d.final_decision for d in example.decisions_b.values()} == {"DEFER"}
    settings = config_b()
    assert (settings.tensor_parallel_size, settings.max_model_len) == (2, 16384)


def test_a_stricter_product_slo_turns_config_a_down_too() -> None:
    example = worked_example(SloTargets(p95_ttft_ms=500.0))
    chat = example.decisions_a[RequestClass.CHAT]
    assert (chat.final_decision, chat.slo_misses) == ("DEFER", ("p95_ttft",))
