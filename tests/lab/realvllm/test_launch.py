"""Which real-vLLM server pairs a run starts ahead of its tests, and in which order."""

from __future__ import annotations

from pathlib import Path

from router.lab.realvllm.install import VllmInstall
from router.lab.realvllm.server import VllmServer
from tests.lab.realvllm.launch import PairSpec, plan_for


def never_built(install: VllmInstall, workdir: Path) -> list[VllmServer]:
    raise AssertionError("planning builds no server")


SPECS = tuple(PairSpec(name, ("tiny",), never_built) for name in ("real_pools", "two_models", "kv_pair"))


def names(plan: list[PairSpec]) -> list[str]:
    return [spec.fixture for spec in plan]


def test_tests_that_use_no_pair_start_none() -> None:
    assert plan_for([("tmp_path",), (), ("request", "stack")], SPECS) == []


def test_pairs_start_in_the_order_their_first_test_runs() -> None:
    uses = [
        ("tmp_path",),
        ("kv_pair", "request"),
        ("real_pools",),
        ("kv_pair",),
        ("lane_router", "two_models"),
    ]
    assert names(plan_for(uses, SPECS)) == ["kv_pair", "real_pools", "two_models"]


def test_only_the_pairs_used_are_planned() -> None:
    assert names(plan_for([("vllm_install",), ("two_models",)], SPECS)) == ["two_models"]
