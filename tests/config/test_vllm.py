"""vLLM settings: vLLM's own start-up rules, and the server configuration hash."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.config import VllmSettings, load_profile, server_configuration_hash
from router.config.vllm import parse_version, vllm_rule_violations


def fields_of(violations: list[tuple[str, str]]) -> list[str]:
    return [field for field, _ in violations]


def test_defaults_satisfy_every_rule() -> None:
    assert vllm_rule_violations(VllmSettings()) == []


# --- rules --------------------------------------------------------------------------------------


def test_batched_tokens_below_max_model_len_needs_chunked_prefill() -> None:
    off = VllmSettings(enable_chunked_prefill=False, max_model_len=4096, max_num_batched_tokens=4095)
    violations = vllm_rule_violations(off)

    assert fields_of(violations) == ["max_num_batched_tokens"]
    assert "max_model_len (4096)" in violations[0][1]
    assert "chunked prefill" in violations[0][1]


def test_batched_tokens_equal_to_max_model_len_is_enough_without_chunked_prefill() -> None:
    v = VllmSettings(enable_chunked_prefill=False, max_model_len=4096, max_num_batched_tokens=4096)

    assert vllm_rule_violations(v) == []


def test_batched_tokens_below_max_model_len_is_fine_with_chunked_prefill() -> None:
    v = VllmSettings(enable_chunked_prefill=True, max_model_len=32768, max_num_batched_tokens=512)

    assert vllm_rule_violations(v) == []


def test_batched_tokens_must_cover_max_num_seqs() -> None:
    below = VllmSettings(max_num_batched_tokens=127, max_num_seqs=128)

    assert vllm_rule_violations(below) == [("max_num_batched_tokens", "must be ≥ max_num_seqs (128)")]
    assert vllm_rule_violations(VllmSettings(max_num_batched_tokens=128, max_num_seqs=128)) == []


def test_long_prefill_threshold_must_not_exceed_max_model_len() -> None:
    above = VllmSettings(max_model_len=2048, long_prefill_token_threshold=2049)

    assert vllm_rule_violations(above) == [("long_prefill_token_threshold", "must be ≤ max_model_len (2048)")]
    assert vllm_rule_violations(VllmSettings(max_model_len=2048, long_prefill_token_threshold=2048)) == []


def test_active_seqs_must_not_exceed_max_num_seqs() -> None:
    above = VllmSettings(max_num_seqs=64, max_num_active_seqs=65)

    assert vllm_rule_violations(above) == [("max_num_active_seqs", "must be ≤ max_num_seqs (64)")]
    assert vllm_rule_violations(VllmSettings(max_num_seqs=64, max_num_active_seqs=64)) == []


@pytest.mark.parametrize("version", ["0.27.0", "0.27.1", "0.33.0", "1.0.0", "0.100.2"])
@pytest.mark.parametrize("flag", ["max_num_partial_prefills", "max_long_partial_prefills"])
def test_partial_prefill_flags_are_rejected_from_0_27(version: str, flag: str) -> None:
    violations = vllm_rule_violations(VllmSettings(version=version, **{flag: 1}))

    assert fields_of(violations) == [flag]
    assert "removed in vLLM 0.27" in violations[0][1]
    assert "admission.max_prefilling" in violations[0][1]


@pytest.mark.parametrize("version", ["0.26.0", "0.26.10", "0.8.5", "0.26.1+cpu"])
def test_partial_prefill_flags_are_accepted_before_0_27_with_long_at_most_total(version: str) -> None:
    for total, long in ((4, 1), (4, 4), (1, 1)):
        v = VllmSettings(version=version, max_num_partial_prefills=total, max_long_partial_prefills=long)
        assert vllm_rule_violations(v) == [], (total, long)


def test_more_long_partial_prefills_than_partial_prefills_is_rejected() -> None:
    v = VllmSettings(version="0.26.0", max_num_partial_prefills=2, max_long_partial_prefills=3)

    assert vllm_rule_violations(v) == [
        ("max_long_partial_prefills", "must be ≤ max_num_partial_prefills (2)")
    ]


def test_several_partial_prefills_need_chunked_prefill() -> None:
    v = VllmSettings(
        version="0.26.0",
        enable_chunked_prefill=False,
        max_model_len=4096,
        max_num_batched_tokens=4096,
        max_num_partial_prefills=2,
    )

    assert fields_of(vllm_rule_violations(v)) == ["max_num_partial_prefills"]


def test_every_broken_rule_is_reported() -> None:
    v = VllmSettings(
        version="0.30.0",
        enable_chunked_prefill=False,
        max_model_len=4096,
        max_num_batched_tokens=64,
        max_num_seqs=128,
        long_prefill_token_threshold=5000,
        max_num_active_seqs=256,
        max_num_partial_prefills=2,
    )

    assert sorted(fields_of(vllm_rule_violations(v))) == [
        "long_prefill_token_threshold",
        "max_num_active_seqs",
        "max_num_batched_tokens",
        "max_num_batched_tokens",
        "max_num_partial_prefills",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.26.1", (0, 26, 1)),
        ("0.27.0+cpu", (0, 27, 0)),
        ("v0.33.0", (0, 33, 0)),
        ("0.26.10", (0, 26, 10)),
        ("1.2", (1, 2)),
    ],
)
def test_parse_version(text: str, expected: tuple[int, ...]) -> None:
    assert parse_version(text) == expected


def test_versions_compare_numerically_not_as_text() -> None:
    assert VllmSettings(version="0.26.10").has_partial_prefill_flags
    assert not VllmSettings(version="0.100.0").has_partial_prefill_flags


# --- server_configuration_hash ------------------------------------------------------------------


def test_hash_is_a_labelled_sha256() -> None:
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", server_configuration_hash(VllmSettings(), "m"))


def test_hash_is_stable_for_equal_configurations() -> None:
    a = VllmSettings(max_num_seqs=64, extra_args=("--enforce-eager",))
    b = VllmSettings(max_num_seqs=64, extra_args=("--enforce-eager",))

    assert server_configuration_hash(a, "m") == server_configuration_hash(b, "m")


def test_explicit_defaults_hash_like_omitted_ones() -> None:
    explicit = VllmSettings(**{name: f.default for name, f in VllmSettings.model_fields.items()})

    assert server_configuration_hash(explicit, "m") == server_configuration_hash(VllmSettings(), "m")


def test_served_model_is_part_of_the_identity() -> None:
    assert server_configuration_hash(VllmSettings(), "a") != server_configuration_hash(VllmSettings(), "b")


def test_hardware_profile_is_not_part_of_the_configuration_hash() -> None:
    # The hardware profile is its own field of an evidence record's identity, beside the hash.
    plain = server_configuration_hash(VllmSettings(), "m")

    assert server_configuration_hash(VllmSettings(hardware_profile="a100-80g"), "m") == plain
    assert server_configuration_hash(VllmSettings(hardware_profile="cpu-8c"), "m") == plain


PARTIAL_FLAGS = {"max_num_partial_prefills", "max_long_partial_prefills"}

# A different valid value for every field; a field added without an entry here fails the coverage test.
CHANGED: dict[str, Any] = {
    "version": "0.33.0",
    "model_revision": "0123abc",
    "max_model_len": 4096,
    "max_num_batched_tokens": 4096,
    "max_num_seqs": 128,
    "long_prefill_token_threshold": 512,
    "stream_interval": 4,
    "enable_prefix_caching": False,
    "enable_chunked_prefill": False,
    "max_num_partial_prefills": 2,
    "max_long_partial_prefills": 1,
    "scheduling_policy": "priority",
    "max_num_queued_reqs": 100,
    "max_num_queued_tokens": 100_000,
    "max_num_active_seqs": 32,
    "block_size": 32,
    "gpu_memory_utilization": 0.8,
    "tensor_parallel_size": 2,
    "pipeline_parallel_size": 2,
    "data_parallel_size": 2,
    "dtype": "bfloat16",
    "kv_cache_dtype": "fp8",
    "extra_args": ("--enforce-eager",),
}


def test_every_field_but_hardware_profile_is_covered_by_the_change_table() -> None:
    assert set(CHANGED) == set(VllmSettings.model_fields) - {"hardware_profile"}


@pytest.mark.parametrize("field", sorted(CHANGED))
def test_every_capacity_field_changes_the_hash(field: str) -> None:
    base: dict[str, Any] = {"version": "0.26.0"} if field in PARTIAL_FLAGS else {}
    before = VllmSettings(**base)
    after = VllmSettings(**{**base, field: CHANGED[field]})
    assert getattr(before, field) != getattr(after, field)

    assert server_configuration_hash(before, "m") != server_configuration_hash(after, "m")


def test_extra_args_keep_each_flag_with_its_value() -> None:
    # Same words, different configuration: the hash must tell them apart.
    a = VllmSettings(extra_args=("--swap-space", "4", "--max-seq-len-to-capture", "8192"))
    b = VllmSettings(extra_args=("--swap-space", "8192", "--max-seq-len-to-capture", "4"))

    assert server_configuration_hash(a, "m") != server_configuration_hash(b, "m")


VALUES: dict[str, st.SearchStrategy[Any]] = {
    "version": st.sampled_from(["0.26.0", "0.30.1", "0.33.0"]),
    "model_revision": st.none() | st.text("0123456789abcdef", min_size=1, max_size=8),
    "max_model_len": st.integers(16, 1 << 20),
    "max_num_batched_tokens": st.integers(1, 1 << 20),
    "max_num_seqs": st.integers(1, 4096),
    "long_prefill_token_threshold": st.integers(0, 1 << 20),
    "stream_interval": st.integers(1, 64),
    "enable_prefix_caching": st.booleans(),
    "enable_chunked_prefill": st.booleans(),
    "max_num_partial_prefills": st.none() | st.integers(1, 64),
    "max_long_partial_prefills": st.none() | st.integers(1, 64),
    "scheduling_policy": st.sampled_from(["fcfs", "priority"]),
    "max_num_queued_reqs": st.none() | st.integers(1, 1 << 16),
    "max_num_queued_tokens": st.none() | st.integers(1, 1 << 24),
    "max_num_active_seqs": st.none() | st.integers(1, 4096),
    "block_size": st.sampled_from([8, 16, 32, 64]),
    "gpu_memory_utilization": st.floats(0.01, 1.0),
    "tensor_parallel_size": st.integers(1, 16),
    "pipeline_parallel_size": st.integers(1, 16),
    "data_parallel_size": st.integers(1, 16),
    "dtype": st.sampled_from(["auto", "float16", "bfloat16", "float32"]),
    "kv_cache_dtype": st.sampled_from(["auto", "fp8", "fp8_e4m3"]),
    # extra_args is exercised by the two dedicated tests above.
}


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_hash_differs_exactly_when_one_field_differs(data: st.DataObject) -> None:
    field = data.draw(st.sampled_from(sorted(VALUES)))
    base: dict[str, Any] = {"version": "0.26.0"} if field in PARTIAL_FLAGS else {}
    a = VllmSettings(**{**base, field: data.draw(VALUES[field])})
    b = VllmSettings(**{**base, field: data.draw(VALUES[field])})

    same_hash = server_configuration_hash(a, "m") == server_configuration_hash(b, "m")
    assert same_hash == (getattr(a, field) == getattr(b, field))


@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_hash_ignores_the_order_settings_are_written_in(data: st.DataObject) -> None:
    chosen = data.draw(st.lists(st.sampled_from(sorted(VALUES)), unique=True, min_size=2))
    values = {name: data.draw(VALUES[name]) for name in chosen}
    shuffled = dict(data.draw(st.permutations(list(values.items()))))

    assert server_configuration_hash(VllmSettings(**values), "m") == server_configuration_hash(
        VllmSettings(**shuffled), "m"
    )


PROFILE = """\
profile: order
pools:
  p:
    backends: ["http://127.0.0.1:9001"]
    model: m
    vllm:
{vllm}
lanes:
  chat: {{pool: p}}
  rag: {{pool: p}}
  long_context: {{pool: p}}
  agent: {{pool: p}}
  batch: {{pool: p}}
  slow_stream: {{pool: p}}
"""


def _hash_of_yaml(tmp_path: Path, name: str, vllm_lines: list[str]) -> str:
    path = tmp_path / name
    path.write_text(PROFILE.format(vllm="\n".join("      " + line for line in vllm_lines)))
    pool = load_profile(path).pools["p"]
    return server_configuration_hash(pool.vllm, pool.model)


def test_hash_from_yaml_ignores_key_order_and_default_spelling(tmp_path: Path) -> None:
    written = ["max_model_len: 4096", "max_num_seqs: 32", "max_num_batched_tokens: 1024"]
    reordered = list(reversed(written))
    with_defaults = [*written, "block_size: 16", "stream_interval: 1", "enable_prefix_caching: true"]

    first = _hash_of_yaml(tmp_path, "a.yaml", written)
    assert _hash_of_yaml(tmp_path, "b.yaml", reordered) == first
    assert _hash_of_yaml(tmp_path, "c.yaml", with_defaults) == first
    assert _hash_of_yaml(tmp_path, "d.yaml", [*written[:2], "max_num_batched_tokens: 2048"]) != first
