from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from router.config.load import ConfigError
from router.lab.bench.profiles import lab_profile, parse_override, with_settings
from tests.lab.bench.lab import two_pools

DATA = two_pools(["http://127.0.0.1:1"], ["http://127.0.0.1:2"])


def test_wildcards_set_every_pool_and_sections_are_created() -> None:
    out = with_settings(
        DATA,
        [parse_override("pools.*.vllm.max_model_len=4096"), parse_override("slow_clients.lag_bytes=16384")],
    )
    assert {p["vllm"]["max_model_len"] for p in out["pools"].values()} == {4096}
    assert out["slow_clients"] == {"lag_bytes": 16384}
    assert DATA["pools"]["bulk"]["vllm"]["max_model_len"] == 2048  # the input is left alone


def test_a_named_pool_the_profile_lacks_is_not_created() -> None:
    out = with_settings(
        DATA,
        [parse_override("pools.large.vllm.max_num_seqs=8"), parse_override("pools.bulk.vllm.max_num_seqs=8")],
    )
    assert "large" not in out["pools"] and out["pools"]["bulk"]["vllm"]["max_num_seqs"] == 8


def test_bad_overrides_are_refused(tmp_path: Path) -> None:
    for text in ("novalue", "=3", "pools..x=1"):
        with pytest.raises(ValueError):
            parse_override(text)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(DATA))
    with pytest.raises(ConfigError) as exc:
        lab_profile(path, [parse_override("pools.*.vllm.max_num_seqs=0")])
    assert any(i.path == "pools.bulk.vllm.max_num_seqs" for i in exc.value.issues)
