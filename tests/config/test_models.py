"""Several models behind one profile: each model's lanes, their names, and the rules that keep a
request's model leading to exactly one model's lanes."""

from __future__ import annotations

import copy
from typing import Any

from router.config import ALL_CLASSES, parse_profile
from router.config.lanemap import lane_plan
from tests.config.test_load import issues_of, paths_of

CHAT_CLASSES = ("chat", "rag", "agent", "slow_stream")
BULK_CLASSES = ("long_context", "batch")


def _pool(port: int, model: str, **extra: Any) -> dict[str, Any]:
    return {"backends": [f"http://127.0.0.1:{port}"], "model": model, **extra}


def multi() -> dict[str, Any]:
    """A chat model on two pools (top-level lanes), an embedding model and a reranker on one each."""
    return {
        "pools": {
            "chat-fast": _pool(8101, "llama", aliases=["llama-chat"], adapters=["sql-lora"]),
            "chat-large": _pool(8102, "llama"),
            "embed": _pool(8103, "bge"),
            "rerank": _pool(8104, "ranker"),
        },
        "lanes": {
            **{c: {"pool": "chat-fast"} for c in CHAT_CLASSES},
            **{c: {"pool": "chat-large"} for c in BULK_CLASSES},
        },
        "models": {"ranker": {"lanes": {"chat": {"pool": "rerank", "max_in_flight": 8}}}},
    }


def changed(change: Any) -> dict[str, Any]:
    data = copy.deepcopy(multi())
    change(data)
    return data


def test_a_profile_of_one_pool_names_its_lanes_by_class_as_before() -> None:
    cfg = parse_profile({"pools": {"only": _pool(8101, "m")}})

    assert [(p.name, p.model, p.config.pool) for p in lane_plan(cfg)] == [
        (c.value, "m", "only") for c in ALL_CLASSES
    ]


def test_top_level_lanes_are_named_by_class_and_other_models_lanes_by_model_and_class() -> None:
    plan = {p.name: p for p in lane_plan(parse_profile(multi()))}

    assert set(plan) == {c.value for c in ALL_CLASSES} | {
        f"{m}:{c.value}" for m in ("bge", "ranker") for c in ALL_CLASSES
    }
    assert {plan[c].config.pool for c in CHAT_CLASSES} == {"chat-fast"}
    assert {plan[c].config.pool for c in BULK_CLASSES} == {"chat-large"}
    assert all(plan[f"bge:{c.value}"].config.pool == "embed" for c in ALL_CLASSES)
    # A lane a model names keeps its settings; the classes it does not name get defaults.
    assert (
        plan["ranker:chat"].config.max_in_flight == 8
        and plan["ranker:chat"].path == "models.ranker.lanes.chat"
    )
    assert plan["ranker:batch"].config.max_in_flight is None and plan["ranker:batch"].path == "pools.rerank"
    assert {plan[n].model for n in plan if ":" not in n} == {"llama"}


def test_a_model_entry_may_set_only_its_tokenizer() -> None:
    # A path must hold a tokenizer.json (tests/request/test_tokenizer_source.py): a rule names none.
    cfg = parse_profile(changed(lambda d: d["models"].__setitem__("bge", {"tokenizer": "utf8-bytes"})))

    assert cfg.models["bge"].tokenizer == "utf8-bytes" and cfg.models["ranker"].tokenizer is None


def test_a_one_pool_profile_may_name_its_lanes_under_its_model() -> None:
    data = {
        "pools": {"only": _pool(8101, "m")},
        "models": {"m": {"lanes": {"batch": {"pool": "only", "priority": 5}}}},
    }

    plan = {p.name: p for p in lane_plan(parse_profile(data))}

    assert set(plan) == {f"m:{c.value}" for c in ALL_CLASSES} and plan["m:batch"].config.priority == 5


def test_names_served_by_pools_of_different_models_are_refused_with_their_path() -> None:
    def overlap(d: dict[str, Any]) -> None:
        d["pools"]["embed"]["aliases"] = ["llama-chat"]
        d["pools"]["rerank"]["adapters"] = ["bge"]

    issues = dict(issues_of(changed(overlap)))

    assert set(issues) == {"pools.embed.aliases", "pools.rerank.adapters"}
    assert "'llama-chat' is also served by pool 'chat-fast' of model 'llama'" in issues["pools.embed.aliases"]
    assert "pool 'embed' of model 'bge'" in issues["pools.rerank.adapters"]


def test_pools_of_one_model_may_share_names() -> None:
    cfg = parse_profile(changed(lambda d: d["pools"]["chat-large"].__setitem__("aliases", ["llama-chat"])))

    assert cfg.pools["chat-large"].aliases == ("llama-chat",)


def test_top_level_lanes_reaching_two_models_are_refused() -> None:
    issues = dict(issues_of(changed(lambda d: d["lanes"]["batch"].__setitem__("pool", "embed"))))

    assert list(issues) == ["lanes.batch.pool"]
    assert "serves model 'bge'" in issues["lanes.batch.pool"]
    assert "models.bge.lanes" in issues["lanes.batch.pool"]


def test_a_models_entry_must_name_a_served_model() -> None:
    def unknown(d: dict[str, Any]) -> None:
        d["models"]["mistral"] = {}
        d["models"]["llama-chat"] = {}

    issues = dict(issues_of(changed(unknown)))

    assert set(issues) == {"models.mistral", "models.llama-chat"}
    assert "no pool serves model 'mistral'" in issues["models.mistral"]
    assert "a name of model 'llama'" in issues["models.llama-chat"]


def test_a_model_lane_must_reach_a_pool_of_that_model() -> None:
    def wrong(d: dict[str, Any]) -> None:
        d["models"]["bge"] = {"lanes": {"chat": {"pool": "rerank"}, "rag": {"pool": "nowhere"}}}

    issues = dict(issues_of(changed(wrong)))

    assert issues["models.bge.lanes.chat.pool"] == "pool 'rerank' serves model 'ranker', not 'bge'"
    assert issues["models.bge.lanes.rag.pool"].startswith("names unknown pool 'nowhere'")


def test_the_top_level_model_names_its_lanes_at_the_top_level_only() -> None:
    data = changed(lambda d: d["models"].__setitem__("llama", {"lanes": {"chat": {"pool": "chat-fast"}}}))

    assert paths_of(data) == {"models.llama.lanes"}


def test_a_model_of_several_pools_needs_a_lane_per_class() -> None:
    def second_pool(d: dict[str, Any]) -> None:
        d["pools"]["rerank-2"] = _pool(8105, "ranker")

    issues = dict(issues_of(changed(second_pool)))

    assert set(issues) == {f"models.ranker.lanes.{c.value}" for c in ALL_CLASSES if c.value != "chat"}
    assert "model 'ranker' is served by several pools (rerank, rerank-2)" in issues["models.ranker.lanes.rag"]


def test_a_pool_no_lane_reaches_is_refused() -> None:
    def unreached(d: dict[str, Any]) -> None:
        d["pools"]["chat-spare"] = _pool(8105, "llama")

    assert issues_of(changed(unreached)) == [
        ("pools.chat-spare", "no lane reaches it: name it in a lane of model 'llama', or remove it")
    ]
