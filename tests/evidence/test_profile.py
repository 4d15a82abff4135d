from __future__ import annotations

from router.config.models import DiscoveryConfig, LaneConfig, RequestClass
from router.config.vllm import server_configuration_hash
from router.evidence.decide import decide
from router.evidence.profile import decide_profile, lane_target, live_records, select_record
from router.evidence.targets import SloTargets, Target
from tests.evidence.factories import (
    BASE_TARGET,
    POOL,
    base_record,
    config_a,
    current_a,
    current_for,
    evolve,
    example_profile,
    profile_a,
    profile_b,
)


def test_a_lane_target_comes_from_its_limits() -> None:
    cfg = profile_a()
    chat = cfg.lanes[RequestClass.CHAT]
    assert lane_target(chat, cfg.pools[POOL]) == Target(
        max_input_tokens=2048, max_output_tokens=512, concurrency=8
    )


def test_open_lane_limits_fall_back_to_what_the_pool_accepts() -> None:
    cfg = example_profile(
        config_a().model_copy(update={"data_parallel_size": 2}),
        max_in_flight=8,
        max_prompt=2048,
        max_output=512,
    )
    pool = cfg.pools[POOL].model_copy(update={"backends": [*cfg.pools[POOL].backends] * 3})
    target = lane_target(LaneConfig(pool=POOL), pool)
    assert target == Target(max_input_tokens=8192, max_output_tokens=8192, concurrency=8 * 2 * 3)


def test_a_pool_found_by_dns_may_see_the_load_of_its_most_backends() -> None:
    cfg = example_profile(config_a(), max_in_flight=8, max_prompt=2048, max_output=512)
    found = {"dns": "vllm.llm.svc.cluster.local", "max_backends": 5}
    pool = cfg.pools[POOL].model_copy(update={"backends": [], "discovery": DiscoveryConfig(**found)})
    target = lane_target(LaneConfig(pool=POOL), pool)
    assert target.concurrency == config_a().max_num_seqs * config_a().data_parallel_size * 5


def test_superseded_records_are_not_live() -> None:
    old = base_record()
    newer = evolve(old, {"measured_at": "2025-06-09T00:00:00Z", "supersedes": old.record_id})
    other = evolve(old, {"measured_at": "2025-06-05T00:00:00Z"})
    assert [r.record_id for r in live_records([old, other, newer])] == [newer.record_id, other.record_id]


def test_select_prefers_the_newest_record_of_the_current_configuration() -> None:
    old = base_record()
    newer = evolve(old, {"measured_at": "2025-06-09T00:00:00Z"})
    other_config = evolve(
        old,
        {
            "measured_at": "2025-07-01T00:00:00Z",
            "identity.server_configuration_hash": "sha256:" + "1" * 64,
        },
    )
    assert select_record([old, other_config, newer], current_a()) == newer


def test_select_prefers_a_record_whose_slice_covers_the_target() -> None:
    covering = base_record()
    narrow_newer = evolve(covering, {"measured_at": "2025-06-09T00:00:00Z", "measured_slice.concurrency": 2})
    records = [covering, narrow_newer]
    assert select_record(records, current_a(), BASE_TARGET) == covering
    wide = BASE_TARGET.model_copy(update={"concurrency": 64})
    assert select_record(records, current_a(), wide) == narrow_newer


def test_select_falls_back_to_the_served_model_so_triggers_can_be_named() -> None:
    record = base_record()
    changed = current_for(config_a().model_copy(update={"max_num_seqs": 16}))
    assert select_record([record], changed) == record
    stranger = evolve(
        record,
        {
            "identity.served_model_name": "another-model",
            "identity.server_configuration_hash": "sha256:" + "2" * 64,
        },
    )
    assert select_record([stranger], current_a()) is None
    assert select_record([], current_a()) is None


def test_the_fallback_is_the_closest_record_of_the_model_not_the_newest() -> None:
    # Two pools of one model: after a change to the first, its own old record names what changed;
    # the other pool's newer record would name differences between pools instead.
    own = base_record()
    other_pool = evolve(
        own,
        {
            "measured_at": "2025-07-01T00:00:00Z",
            "identity.server_configuration_hash": "sha256:" + "3" * 64,
            "context.knobs.max_num_seqs": 16,
            "context.knobs.max_num_batched_tokens": 8192,
            "measured_slice.concurrency": 4,
        },
    )
    changed = current_for(config_a().model_copy(update={"tensor_parallel_size": 2}))
    for records in ([own, other_pool], [other_pool, own]):
        assert select_record(records, changed, BASE_TARGET) == own
    twin = evolve(own, {"measured_at": "2025-06-09T00:00:00Z"})
    assert select_record([own, twin], changed, BASE_TARGET) == twin  # equally close: the newest


def test_decide_profile_judges_every_lane() -> None:
    cfg = profile_a()
    decisions = decide_profile(cfg, [base_record()], SloTargets())
    assert set(decisions) == set(RequestClass)
    chat = decisions[RequestClass.CHAT]
    assert chat == decide(base_record(), BASE_TARGET, current_a(), SloTargets())
    assert chat.final_decision == "PASS"


def test_decide_profile_targets_override_the_lane() -> None:
    wide = BASE_TARGET.model_copy(update={"concurrency": 9})
    decisions = decide_profile(profile_a(), [base_record()], SloTargets(), {RequestClass.CHAT: wide})
    assert decisions[RequestClass.CHAT].reason_class == "outside_measured_slice"
    assert decisions[RequestClass.CHAT].triggers == ("concurrency",)


def test_decide_profile_without_records_defers_every_lane() -> None:
    decisions = decide_profile(profile_b(), [], SloTargets())
    assert {d.reason_class for d in decisions.values()} == {"no_evidence"}


def test_the_record_of_the_pool_is_bound_to_the_profile_hash() -> None:
    assert base_record().identity.server_configuration_hash == server_configuration_hash(
        config_a(), profile_a().pools[POOL].model
    )
