"""The six profiles of config/profiles/: valid, comparable, and runnable against simulated pools;
and no profile or document we ship holds a key, only the variables that name one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.balance.settings import PrefixAffinitySettings
from router.cli import main
from router.config.lanemap import lane_plan, served_models
from router.config.load import load_profile
from router.config.models import ALL_CLASSES
from router.keys.auth import hash_key

PROFILES = Path(__file__).resolve().parents[2] / "config" / "profiles"
NAMES = (
    "shared-pool",
    "large-token-pool",
    "small-interactive-pool",
    "prefix-cache-routing",
    "slow-client-isolation",
    "class-aware",
)
# The profile of several models beside the six of one model each.
MULTI = "multi-model"
BACKENDS = [f"http://127.0.0.1:{port}" for port in range(8101, 8109)]
ENV_KEYS = (
    "LANE_ROUTER_KEY_TESTER_SHA256",
    "LANE_ROUTER_KEY_WEB_SHA256",
    "LANE_ROUTER_KEY_BATCH_SHA256",
    "LANE_ROUTER_KEY_OPS_SHA256",
)
REPO = PROFILES.parents[1]
SHIPPED_PROFILES = (
    *sorted(PROFILES.glob("*.yaml")),
    REPO / "router" / "lab" / "data" / "demo-profile.yaml",
    REPO / "deploy" / "example-profile.yaml",
)
SHIPPED_TEXT = tuple(
    sorted(
        p
        for pattern in (
            "config/**/*.yaml",
            "router/lab/data/*.yaml",
            "deploy/**/*.y*ml",
            "deploy/*.md",
            "docs/*.md",
            "*.md",
        )
        for p in REPO.glob(pattern)
    )
)


def path(name: str) -> Path:
    return PROFILES / f"{name}.yaml"


def test_the_six_profiles_and_nothing_else() -> None:
    assert sorted(p.stem for p in PROFILES.glob("*.yaml")) == sorted((*NAMES, MULTI))


@pytest.mark.parametrize("name", (*NAMES, MULTI))
def test_lane_router_check_passes(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(path(name))]) == 0
    assert f"profile: {name}  (valid)" in capsys.readouterr().out


@pytest.mark.parametrize("name", (*NAMES, MULTI))
def test_intent_comment_and_how_to_make_keys(name: str) -> None:
    text = path(name).read_text()
    assert text.startswith(f"# {name} — ")
    assert "lane-router hash-key --new" in text
    cfg = load_profile(path(name))
    assert [k.sha256_env for k in cfg.keys] == list(ENV_KEYS)
    assert [k.name for k in cfg.keys if k.may_set_class] == ["tester"]


@pytest.mark.parametrize("shipped", SHIPPED_PROFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_profile_loads_and_holds_no_literal_key(shipped: Path) -> None:
    cfg = load_profile(shipped)
    assert [k.name for k in cfg.keys if k.sha256 is not None] == []


@pytest.mark.parametrize("shipped", SHIPPED_TEXT, ids=lambda p: str(p.relative_to(REPO)))
def test_nothing_shipped_holds_a_literal_key_or_names_the_old_demo_key(shipped: Path) -> None:
    text = shipped.read_text(encoding="utf-8")
    assert "demo-key" not in text and hash_key("demo-key") not in text
    if shipped.suffix in (".yaml", ".yml"):
        assert [k for doc in yaml.safe_load_all(text) for k in literal_keys(doc)] == []


def literal_keys(node: Any) -> Iterator[dict[str, Any]]:
    """Every entry of a `keys:` list with a literal sha256, in a document or a profile embedded
    in it as text (a ConfigMap's data, a compose config's content)."""
    if isinstance(node, dict):
        keys = node.get("keys")
        if isinstance(keys, list):
            yield from (k for k in keys if isinstance(k, dict) and "sha256" in k)
        for value in node.values():
            yield from literal_keys(value)
    elif isinstance(node, list):
        for item in node:
            yield from literal_keys(item)
    elif isinstance(node, str) and "\nkeys:" in node:
        yield from literal_keys(yaml.safe_load(node.replace("$$", "$")))


def test_the_literal_key_scan_can_fail() -> None:
    embedded = {"data": {"profile.yaml": "profile: x\nkeys:\n  - {name: a, sha256: " + "1" * 64 + "}\n"}}
    by_env = {"keys": [{"name": "b", "sha256_env": "B"}]}
    assert [k["name"] for k in literal_keys([embedded, by_env])] == ["a"]


def test_the_profiles_differ_as_the_source_lab_says() -> None:
    cfgs = {name: load_profile(path(name)) for name in NAMES}
    assert [len(c.pools) for c in cfgs.values()] == [1, 1, 1, 1, 2, 4]
    aware = cfgs["class-aware"]
    interactive, large = aware.pools["interactive"].vllm, aware.pools["large"].vllm
    assert interactive.max_num_batched_tokens < large.max_num_batched_tokens
    assert interactive.max_num_seqs < large.max_num_seqs
    adm = aware.pools["interactive"].admission
    assert adm.max_long_prefilling is not None and adm.max_prefilling is not None
    assert adm.max_long_prefilling < adm.max_prefilling
    assert aware.lanes["rag"].balance.strategy == "prefix_affinity"
    assert aware.lanes["agent"].balance == PrefixAffinitySettings(affinity="session", min_tokens=256)
    assert aware.lanes["slow_stream"].decouple and aware.lanes["slow_stream"].pool == "isolation"
    assert aware.pools["isolation"].vllm.stream_interval > 1
    assert cfgs["slow-client-isolation"].lanes["slow_stream"].decouple
    assert all(
        lane.balance.strategy == "prefix_affinity" for lane in cfgs["prefix-cache-routing"].lanes.values()
    )


def test_the_multi_model_profile_has_a_chat_model_on_two_pools_an_adapter_an_embedder_and_a_reranker() -> (
    None
):
    cfg = load_profile(path(MULTI))
    plan = {(p.model, p.cls.value): p for p in lane_plan(cfg)}
    chat, embed, rerank = served_models(cfg)

    assert len({plan[chat, c.value].config.pool for c in ALL_CLASSES}) >= 2
    assert set(served_models(cfg)[chat]) == {"interactive", "large"}
    assert all(cfg.pools[p].adapters == ("sql-lora",) for p in served_models(cfg)[chat])
    for model in (embed, rerank):
        assert len(served_models(cfg)[model]) == 1
        assert {plan[model, c.value].name for c in ALL_CLASSES} == {f"{model}:{c.value}" for c in ALL_CLASSES}
