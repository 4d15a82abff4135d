"""Loading a profile: a complete file validates; every problem is reported with its dotted path."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.config import ALL_CLASSES, ConfigError, RequestClass, load_profile, parse_profile

DIGEST_A = "a" * 64
DIGEST_B = "b" * 64


def valid_profile() -> dict[str, Any]:
    """A complete profile exercising every section; tests mutate a fresh copy."""
    return {
        "profile": "unit",
        "pools": {
            "interactive": {
                "backends": ["http://127.0.0.1:8101", "http://127.0.0.1:8102"],
                "model": "org/chat-model",
                "aliases": ["chat"],
                "upstream_api_key_env": "POOL_INTERACTIVE_KEY",
                "vllm": {
                    "version": "0.33.0",
                    "max_model_len": 8192,
                    "max_num_batched_tokens": 2048,
                    "max_num_seqs": 64,
                    "long_prefill_token_threshold": 512,
                    "stream_interval": 1,
                    "enable_prefix_caching": True,
                },
                "admission": {"max_prefilling": 8, "max_long_prefilling": 2},
            },
            "batch": {
                "backends": ["http://127.0.0.1:8201"],
                "model": "org/chat-model",
                "vllm": {"max_model_len": 32768, "max_num_batched_tokens": 8192, "max_num_seqs": 32},
            },
        },
        "lanes": {
            "chat": {"pool": "interactive", "balance": "least_outstanding", "priority": 0},
            "rag": {"pool": "interactive", "balance": "prefix_affinity"},
            "long_context": {"pool": "batch"},
            "agent": {"pool": "interactive", "balance": "prefix_affinity"},
            "batch": {"pool": "batch", "priority": 9},
            "slow_stream": {"pool": "interactive", "decouple": True},
        },
        "classify": {
            "long_context_tokens": 6000,
            "repeated_prefix": {"min_tokens": 512, "seen": 2, "window_s": 600},
        },
        "keys": [
            {"name": "web", "sha256": DIGEST_A, "classes": ["chat", "agent", "rag"], "rpm": 600},
            {"name": "nightly", "sha256_env": "NIGHTLY_KEY_SHA256", "pin_class": "batch"},
            {"name": "ops", "sha256": "sha256:" + DIGEST_B, "admin": True},
        ],
    }


def issues_of(data: Any) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        parse_profile(data)
    return [(issue.path, issue.message) for issue in info.value.issues]


def paths_of(data: Any) -> set[str]:
    return {path for path, _ in issues_of(data)}


def mutated(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    data = copy.deepcopy(valid_profile())
    change(data)
    return data


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "profile.yaml"
    path.write_text(text, encoding="utf-8")
    return path


# --- a valid profile -----------------------------------------------------------------------------


def test_complete_profile_loads_with_its_values() -> None:
    cfg = parse_profile(valid_profile())

    assert cfg.profile == "unit"
    assert set(cfg.lanes) == set(ALL_CLASSES)
    assert cfg.lanes[RequestClass.BATCH].priority == 9
    assert cfg.lanes[RequestClass.SLOW_STREAM].decouple is True
    assert cfg.pools["interactive"].origins == ("http://127.0.0.1:8101", "http://127.0.0.1:8102")
    assert cfg.pools["interactive"].models == ("org/chat-model", "chat")
    assert cfg.pools["interactive"].vllm.max_num_seqs == 64
    assert cfg.pools["batch"].vllm.max_model_len == 32768
    assert [k.name for k in cfg.keys] == ["web", "nightly", "ops"]
    assert cfg.keys[1].pin_class is RequestClass.BATCH


def test_omitted_settings_take_their_documented_defaults() -> None:
    cfg = parse_profile(valid_profile())

    assert cfg.max_body_bytes == 4 * 1024 * 1024
    assert cfg.lanes[RequestClass.LONG_CONTEXT].balance.strategy == "least_outstanding"
    assert cfg.keys[0].max_concurrency is None
    assert cfg.keys[0].may_set_class is False


def test_yaml_file_loads_like_the_same_mapping(tmp_path: Path) -> None:
    path = write(tmp_path, yaml.safe_dump(valid_profile()))

    assert load_profile(path) == parse_profile(valid_profile())


def test_no_keys_is_a_valid_profile() -> None:
    cfg = parse_profile(mutated(lambda d: d.pop("keys")))

    assert cfg.keys == ()


# --- cross-checks: each reports its own dotted path ---------------------------------------------


def _del_lane(cls: str) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["lanes"].pop(cls)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(d: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        node: Any = d
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return change


def _add_key(entry: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["keys"].append(entry)


CROSS_CHECKS: list[tuple[str, Callable[[dict[str, Any]], None], str, str]] = [
    ("unknown pool in a lane", _set("lanes/rag/pool", "nowhere"), "lanes.rag.pool", "unknown pool"),
    ("class without a lane", _del_lane("rag"), "lanes.rag", "missing"),
    (
        "max_long_prefilling equal to max_prefilling",
        _set("pools/interactive/admission", {"max_prefilling": 4, "max_long_prefilling": 4}),
        "pools.interactive.admission.max_long_prefilling",
        "must be < max_prefilling",
    ),
    (
        "max_long_prefilling above max_prefilling",
        _set("pools/interactive/admission", {"max_prefilling": 4, "max_long_prefilling": 6}),
        "pools.interactive.admission.max_long_prefilling",
        "must be < max_prefilling",
    ),
    (
        "max_long_prefilling without max_prefilling",
        _set("pools/interactive/admission", {"max_long_prefilling": 1}),
        "pools.interactive.admission.max_long_prefilling",
        "needs max_prefilling",
    ),
    (
        "the same backend twice",
        _set("pools/interactive/backends", ["http://127.0.0.1:8101", "http://127.0.0.1:8101/"]),
        "pools.interactive.backends",
        "twice",
    ),
    (
        "the same backend with and without its default port",
        _set("pools/batch/backends", ["http://localhost", "http://localhost:80"]),
        "pools.batch.backends",
        "twice",
    ),
    (
        "key with both sha256 and sha256_env",
        _add_key({"name": "both", "sha256": DIGEST_A[:-1] + "c", "sha256_env": "X"}),
        "keys[3].sha256",
        "exactly one",
    ),
    ("key with neither sha256 nor sha256_env", _add_key({"name": "none"}), "keys[3].sha256", "exactly one"),
    (
        "pin_class outside the key's classes",
        _add_key({"name": "pinned", "sha256": "c" * 64, "classes": ["chat"], "pin_class": "batch"}),
        "keys[3].pin_class",
        "not among the key's classes",
    ),
    (
        "duplicate key name",
        _add_key({"name": "web", "sha256": "c" * 64}),
        "keys[3].name",
        "duplicate key name 'web'",
    ),
    (
        "a vLLM start-up rule",
        _set("pools/batch/vllm/max_num_seqs", 16384),
        "pools.batch.vllm.max_num_batched_tokens",
        "must be ≥ max_num_seqs (16384)",
    ),
]


@pytest.mark.parametrize(
    ("change", "path", "fragment"), [c[1:] for c in CROSS_CHECKS], ids=[c[0] for c in CROSS_CHECKS]
)
def test_cross_check_reports_its_exact_path(
    change: Callable[[dict[str, Any]], None], path: str, fragment: str
) -> None:
    issues = issues_of(mutated(change))

    assert [p for p, _ in issues] == [path]
    assert fragment in issues[0][1]


def test_max_long_prefilling_below_max_prefilling_is_accepted() -> None:
    for long in (0, 3):
        data = mutated(
            _set("pools/interactive/admission", {"max_prefilling": 4, "max_long_prefilling": long})
        )
        assert parse_profile(data).pools["interactive"].admission.max_long_prefilling == long


def test_one_model_may_be_served_by_several_pools() -> None:
    # Class-aware routing sends one model's traffic to different pools by lane.
    def change(d: dict[str, Any]) -> None:
        d["pools"]["batch"]["model"] = "org/chat-model"
        d["pools"]["batch"]["aliases"] = ["chat"]

    cfg = parse_profile(mutated(change))

    assert cfg.pools["batch"].models == cfg.pools["interactive"].models


def test_pin_class_among_the_key_classes_is_accepted() -> None:
    data = mutated(_add_key({"name": "p", "sha256": "c" * 64, "classes": ["batch"], "pin_class": "batch"}))

    assert parse_profile(data).keys[3].pin_class is RequestClass.BATCH


def test_every_missing_lane_is_reported() -> None:
    data = mutated(lambda d: d.__setitem__("lanes", {"chat": {"pool": "interactive"}}))

    assert paths_of(data) == {f"lanes.{c.value}" for c in ALL_CLASSES if c is not RequestClass.CHAT}


def test_several_cross_check_errors_are_reported_together() -> None:
    def change(d: dict[str, Any]) -> None:
        d["lanes"]["chat"]["pool"] = "nowhere"
        d["lanes"].pop("agent")
        d["pools"]["batch"]["admission"] = {"max_prefilling": 2, "max_long_prefilling": 2}
        d["keys"].append({"name": "web"})

    assert paths_of(mutated(change)) == {
        "lanes.chat.pool",
        "lanes.agent",
        "pools.batch.admission.max_long_prefilling",
        "keys[3].name",
        "keys[3].sha256",
    }


def test_several_field_errors_are_reported_together() -> None:
    def change(d: dict[str, Any]) -> None:
        d["pools"]["batch"]["vllm"]["max_num_seqs"] = 0
        d["lanes"]["chat"]["priority"] = 101
        d["keys"][0]["rpm"] = 0
        d["pools"]["interactive"].pop("model")

    assert set(issues_of(mutated(change))) == {
        ("pools.batch.vllm.max_num_seqs", "must be ≥ 1"),
        ("lanes.chat.priority", "must be ≤ 100"),
        ("keys[0].rpm", "must be ≥ 1"),
        ("pools.interactive.model", "required"),
    }


def test_error_text_lists_every_problem_as_path_and_message() -> None:
    data = mutated(_set("pools/batch/vllm/max_num_seqs", 0))
    with pytest.raises(ConfigError) as info:
        parse_profile(data, "profile.yaml")

    text = str(info.value)
    assert text.startswith("profile.yaml: 1 problem(s)")
    assert "pools.batch.vllm.max_num_seqs: must be ≥ 1" in text


# --- field-level rules --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "path"),
    [
        (_set("surprise", 1), "surprise"),
        (_set("pools/batch/vllm/max_num_seq", 8), "pools.batch.vllm.max_num_seq"),
        (_set("pools/batch/admission", {"max_prefill": 2}), "pools.batch.admission.max_prefill"),
        (_set("lanes/chat/weight", 2), "lanes.chat.weight"),
        (_set("keys/0/scope", "all"), "keys[0].scope"),
        (_set("classify/repeated_prefix/min_token", 3), "classify.repeated_prefix.min_token"),
    ],
)
def test_unknown_keys_are_rejected_with_their_path(
    change: Callable[[dict[str, Any]], None], path: str
) -> None:
    assert issues_of(mutated(change)) == [(path, "unknown key")]


def test_unknown_class_name_for_a_lane_is_rejected_at_that_lane() -> None:
    issues = issues_of(mutated(_set("lanes/chitchat", {"pool": "interactive"})))

    assert len(issues) == 1
    assert issues[0][0].startswith("lanes.chitchat")


@pytest.mark.parametrize(
    ("backend", "fragment"),
    [
        ("http://127.0.0.1:8101/v1", "without path"),
        ("ftp://127.0.0.1:21", "scheme"),
        ("not a url", "URL"),
    ],
)
def test_backends_must_be_origins(backend: str, fragment: str) -> None:
    issues = issues_of(mutated(_set("pools/batch/backends", [backend])))

    assert len(issues) == 1
    assert issues[0][0].startswith("pools.batch.backends")
    assert fragment in issues[0][1]


@pytest.mark.parametrize(
    "backend",
    ["http://127.0.0.1:8101?tenant=a", "http://user:secret@127.0.0.1:8101", "http://127.0.0.1:8101#x"],
    ids=["query", "userinfo", "fragment"],
)
def test_backend_with_parts_beyond_an_origin_is_rejected(backend: str) -> None:
    # `origins` keeps only scheme, host and port; anything else would be dropped without a word.
    assert any(
        path.startswith("pools.batch.backends")
        for path in paths_of(mutated(_set("pools/batch/backends", [backend])))
    )


def test_an_empty_backend_list_is_rejected() -> None:
    issues = issues_of(mutated(_set("pools/batch/backends", [])))
    assert [path for path, _ in issues] == ["pools.batch"]
    assert "backends" in issues[0][1] and "discovery" in issues[0][1]


DISCOVERY = {"dns": "vllm-batch.llm.svc.cluster.local", "port": 8000, "interval_s": 5}


def test_a_pool_may_find_its_backends_by_dns_instead() -> None:
    def by_dns(d: dict[str, Any]) -> None:
        del d["pools"]["batch"]["backends"]
        d["pools"]["batch"]["discovery"] = DISCOVERY

    cfg = parse_profile(mutated(by_dns))
    found = cfg.pools["batch"].discovery
    assert found is not None and (found.dns, found.port, found.max_backends) == (DISCOVERY["dns"], 8000, 64)
    assert cfg.pools["batch"].origins == ()


def test_backends_and_discovery_together_are_rejected() -> None:
    issues = issues_of(mutated(_set("pools/batch/discovery", DISCOVERY)))
    assert [path for path, _ in issues] == ["pools.batch"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("dns", "bad name!"), ("port", 0), ("interval_s", 0), ("max_backends", 0), ("scheme", "ftp")],
)
def test_discovery_fields_are_checked_with_their_paths(field: str, value: Any) -> None:
    def by_dns(d: dict[str, Any]) -> None:
        del d["pools"]["batch"]["backends"]
        d["pools"]["batch"]["discovery"] = {**DISCOVERY, field: value}

    assert paths_of(mutated(by_dns)) == {f"pools.batch.discovery.{field}"}


def test_pool_names_must_be_plain_names() -> None:
    issues = issues_of(mutated(lambda d: d["pools"].__setitem__("bad name", d["pools"].pop("batch"))))

    assert any(path.startswith("pools.bad name") for path, _ in issues)


def test_key_digest_must_be_lowercase_hex_sha256() -> None:
    for bad in ("A" * 64, "a" * 63, "sha1:" + "a" * 64):
        assert paths_of(mutated(_set("keys/0/sha256", bad))) == {"keys[0].sha256"}


def test_at_least_one_pool_is_required() -> None:
    assert "pools" in paths_of(mutated(_set("pools", {})))


# --- files --------------------------------------------------------------------------------------


def test_yaml_syntax_error_gives_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "profile: x\npools:\n  p: {backends: [http://a:1]\n  model: m\n")
    with pytest.raises(ConfigError) as info:
        load_profile(path)

    (issue,) = info.value.issues
    match = re.fullmatch(r"line (\d+), column (\d+)", issue.path)
    assert match is not None
    assert int(match.group(1)) in (3, 4)
    assert issue.message.startswith("invalid YAML")
    assert info.value.source == str(path)


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "just a string\n"])
def test_a_file_that_is_not_a_mapping_is_rejected(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_profile(write(tmp_path, text))

    assert [i.path for i in info.value.issues] == ["(top level)"]


def test_a_missing_file_is_reported_not_raised_as_oserror(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_profile(tmp_path / "absent.yaml")

    assert [i.path for i in info.value.issues] == ["(file)"]


def test_one_pool_needs_no_lanes_and_takes_every_class() -> None:
    data = valid_profile()
    data["pools"].pop("batch")
    data.pop("lanes")
    cfg = parse_profile(data)
    assert set(cfg.lanes) == set(ALL_CLASSES)
    assert {lane.pool for lane in cfg.lanes.values()} == {"interactive"}


def test_one_pool_keeps_the_lanes_it_names_and_fills_the_others() -> None:
    data = valid_profile()
    data["pools"].pop("batch")
    data["lanes"] = {"batch": {"pool": "interactive", "priority": 9}}
    cfg = parse_profile(data)
    assert cfg.lanes[RequestClass.BATCH].priority == 9
    assert cfg.lanes[RequestClass.CHAT].priority == 0 and set(cfg.lanes) == set(ALL_CLASSES)


def test_several_pools_still_need_a_lane_per_class() -> None:
    data = valid_profile()
    data.pop("lanes")
    assert paths_of(data) == {f"lanes.{c.value}" for c in ALL_CLASSES}


def test_a_lane_alone_at_its_priority_may_count_turns_in_tokens() -> None:
    data = mutated(_set("lanes/long_context/fair_by", "tokens"))
    assert parse_profile(data).lanes[RequestClass.LONG_CONTEXT].fair_by == "tokens"


def test_lanes_sharing_a_pool_and_a_priority_must_count_turns_alike() -> None:
    issues = issues_of(mutated(_set("lanes/chat/fair_by", "tokens")))

    # chat, rag, agent and slow_stream wait in one order on the interactive pool.
    assert [p for p, _ in issues] == [f"lanes.{c}.fair_by" for c in ("chat", "rag", "agent", "slow_stream")]
    assert "count turns both in requests and in tokens" in issues[0][1]


def test_a_lane_counts_turns_in_requests_or_tokens_only() -> None:
    assert paths_of(mutated(_set("lanes/chat/fair_by", "bytes"))) == {"lanes.chat.fair_by"}
