from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.config.load import ConfigError
from router.lab.bench.workload import load_workload, parse_workload

ROOT = Path(__file__).resolve().parents[3]
WORKLOADS = sorted((ROOT / "config" / "workloads").glob("*.yaml"))
BASE: dict[str, Any] = yaml.safe_load((ROOT / "config/workloads/mixed-six.yaml").read_text())


def issues(data: Any) -> dict[str, str]:
    with pytest.raises(ConfigError) as exc:
        parse_workload(data, "test.yaml")
    return {i.path: i.message for i in exc.value.issues}


def changed(**paths: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    for dotted, value in paths.items():
        *parents, leaf = dotted.split("__")
        node = data
        for p in parents:
            node = node[p]
        node[leaf] = value
    return data


@pytest.mark.parametrize("path", WORKLOADS, ids=lambda p: p.name)
def test_shipped_workloads_are_valid(path: Path) -> None:
    spec = load_workload(path)
    assert sum(c.share for c in spec.classes.values()) == pytest.approx(1.0)
    if spec.tenants:  # a tenants' workload needs only the classes its tenants send
        return
    if spec.name.startswith("prefix-"):  # `bench prefix`'s: one class on every lane
        assert len(spec.classes) == 1
        return
    assert set(spec.class_names()) == {"chat", "rag", "long_context", "agent", "batch", "slow_stream"}


def test_cpu_workload_fits_a_2048_token_model() -> None:
    spec = load_workload(ROOT / "config/workloads/mixed-six-cpu.yaml")
    for name in spec.class_names():
        c = spec.spec(name)
        assert c.max_prompt_tokens() + c.output_tokens.high < 2048, name


def test_errors_name_their_dotted_path() -> None:
    found = issues(changed(classes__chat__share=1.5, classes__batch__output_tokens__min=0))
    assert found["classes.chat.share"] == "must be ≤ 1"
    assert found["classes.batch.output_tokens.min"] == "must be ≥ 1"


def test_unknown_keys_and_classes_are_reported() -> None:
    data = changed(classes__rag__colour="blue")
    data["classes"]["gossip"] = copy.deepcopy(data["classes"]["chat"])
    found = issues(data)
    assert found["classes.rag.colour"] == "unknown key"
    assert any(path.startswith("classes.gossip") for path in found)


def test_rules_across_fields_are_reported_at_their_object() -> None:
    data = changed(classes__rag__question_tokens=None)
    del data["classes"]["rag"]["question_tokens"]
    found = issues(data)
    assert "documents need question_tokens" in found["classes.rag"]
    found = issues(changed(classes__chat__prompt_tokens={"dist": "lognormal", "min": 10, "max": 5}))
    assert "min (10) must be ≤ max (5)" in found["classes.chat.prompt_tokens"]


def test_shares_must_add_up_to_one() -> None:
    found = issues(changed(classes__chat__share=0.30))
    assert "class shares must add up to 1" in found["(top level)"]


def test_slow_readers_need_a_stream() -> None:
    found = issues(changed(classes__slow_stream__stream=False))
    assert "slow_readers read a stream" in found["classes.slow_stream"]


def test_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError) as exc:
        load_workload(bad)
    assert exc.value.issues[0].path.startswith("line ")
    with pytest.raises(ConfigError) as exc:
        load_workload(tmp_path / "missing.yaml")
    assert exc.value.issues[0].path == "(file)"
