"""A discovery pool in a profile: its nameservers are addresses, two pools cannot name the same
servers, and `lane-router check` says where each pool's backends come from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from router.cli import main
from router.config import parse_profile
from tests.config.test_load import issues_of, mutated

DISCOVERY = {"dns": "vllm-batch.llm.svc.cluster.local", "port": 8000, "interval_s": 5}


def _by_dns(**discovery: Any) -> Any:
    def change(d: dict[str, Any]) -> None:
        del d["pools"]["batch"]["backends"]
        d["pools"]["batch"]["discovery"] = {**DISCOVERY, **discovery}

    return change


def test_nameservers_must_be_addresses_with_an_optional_port() -> None:
    data = mutated(_by_dns(nameservers=["10.96.0.10", "[fd00::10]:5353", "kube-dns.kube-system"]))

    assert [path for path, _ in issues_of(data)] == ["pools.batch.discovery.nameservers[2]"]
    parse_profile(mutated(_by_dns(nameservers=["10.96.0.10", "127.0.0.1:5353"])))


def test_two_pools_cannot_find_the_same_servers() -> None:
    def both(d: dict[str, Any]) -> None:
        _by_dns()(d)
        del d["pools"]["interactive"]["backends"]
        d["pools"]["interactive"]["discovery"] = {**DISCOVERY, "dns": DISCOVERY["dns"].upper() + "."}

    issues = issues_of(mutated(both))

    assert [path for path, _ in issues] == ["pools.batch.discovery.dns"]
    assert "pool 'interactive'" in issues[0][1]


def test_check_shows_where_each_pools_backends_come_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(mutated(_by_dns(nameservers=["10.96.0.10"]))))

    assert main(["check", str(path)]) == 0

    out = capsys.readouterr().out
    assert "backends: dns vllm-batch.llm.svc.cluster.local:8000 every 5s, at most 64 via 10.96.0.10" in out
    assert "backends: 2 listed" in out
