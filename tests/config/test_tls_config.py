"""A pool's `tls:` block and https backends in the profile: what is accepted, what is refused
(with the dotted path of the field), and what `lane-router check` prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.config.load import ConfigError, parse_profile
from router.tls.upstream import upstream_tls
from tests.support.profiles import profile
from tests.support.tlscerts import TestCA


def _pool(data: dict[str, Any]) -> dict[str, Any]:
    pool: dict[str, Any] = data["pools"]["interactive"]
    return pool


def _issues(data: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as err:
        parse_profile(data)
    return [(i.path, i.message) for i in err.value.issues]


def test_https_backends_with_a_ca_bundle_and_a_client_certificate(tmp_path: Path) -> None:
    ca = TestCA(tmp_path)
    client = ca.issue("router")
    data = profile(["https://127.0.0.1:8443", "https://vllm-0.internal"])
    _pool(data)["tls"] = {
        "ca_file": str(ca.ca_file),
        "client_cert_file": str(client.cert),
        "client_key_file": str(client.key),
    }
    pool = parse_profile(data).pools["interactive"]
    assert pool.origins == ("https://127.0.0.1:8443", "https://vllm-0.internal:443")
    tls = upstream_tls(pool, "pools.interactive")
    assert tls is not None and tls.server_name is None  # each backend's own host is checked


def test_an_https_pool_without_a_tls_block_verifies_against_the_system_cas() -> None:
    pool = parse_profile(profile(["https://127.0.0.1:8443"])).pools["interactive"]
    tls = upstream_tls(pool, "pools.interactive")
    assert tls is not None and tls.config is None and tls.context.get_ca_certs() is not None


def test_a_discovered_https_pool_checks_certificates_against_the_discovered_name() -> None:
    data = profile(["http://127.0.0.1:1"])
    pool = _pool(data)
    del pool["backends"]
    pool["discovery"] = {"dns": "vllm.serving.svc.cluster.local", "scheme": "https"}
    tls = upstream_tls(parse_profile(data).pools["interactive"], "pools.interactive")
    assert tls is not None and tls.server_name == "vllm.serving.svc.cluster.local"
    pool["tls"] = {"server_name": "vllm.internal"}
    tls = upstream_tls(parse_profile(data).pools["interactive"], "pools.interactive")
    assert tls is not None and tls.server_name == "vllm.internal"


def test_verification_cannot_be_turned_off() -> None:
    data = profile(["https://127.0.0.1:8443"])
    _pool(data)["tls"] = {"verify": False}
    [(path, message)] = _issues(data)
    assert path == "pools.interactive.tls.verify"
    assert "must be true" in message and "ca_file" in message


@pytest.mark.parametrize(
    ("block", "path", "fragment"),
    [
        ({"ca_file": "/nonexistent/ca.pem"}, "pools.interactive.tls.ca_file", "cannot read"),
        (
            {"client_cert_file": "/x.pem"},
            "pools.interactive.tls",
            "both client_cert_file and client_key_file",
        ),
        ({"insecure": True}, "pools.interactive.tls.insecure", "unknown key"),
        ({"server_name": "has space"}, "pools.interactive.tls.server_name", "pattern"),
    ],
)
def test_tls_block_errors_name_their_field(block: dict[str, Any], path: str, fragment: str) -> None:
    data = profile(["https://127.0.0.1:8443"])
    _pool(data)["tls"] = block
    [(found, message)] = _issues(data)
    assert found == path
    assert fragment in message


def test_files_that_are_not_certificates_are_refused_with_their_field(tmp_path: Path) -> None:
    ca = TestCA(tmp_path)
    other = TestCA(tmp_path, "other").issue("router")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    data = profile(["https://127.0.0.1:8443"])
    _pool(data)["tls"] = {"ca_file": str(garbage)}
    [(path, message)] = _issues(data)
    assert (path, "not a PEM CA bundle" in message) == ("pools.interactive.tls.ca_file", True)
    mine = ca.issue("router")
    _pool(data)["tls"] = {"client_cert_file": str(mine.cert), "client_key_file": str(other.key)}
    [(path, message)] = _issues(data)
    assert path == "pools.interactive.tls.client_cert_file"
    assert "the key does not belong to the certificate" in message


def test_a_tls_block_on_a_pool_without_https_backends_is_refused() -> None:
    data = profile(["http://127.0.0.1:8101"])
    _pool(data)["tls"] = {"server_name": "vllm.internal"}
    assert _issues(data) == [
        ("pools.interactive.tls", "applies only to https:// backends (the pool has none)")
    ]


def test_check_prints_each_pools_tls(tmp_path: Path) -> None:
    ca = TestCA(tmp_path)
    data = profile(["https://127.0.0.1:8443"], ["http://127.0.0.1:8102"])
    _pool(data)["tls"] = {"ca_file": str(ca.ca_file), "server_name": "vllm.internal"}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    done = subprocess.run(
        [sys.executable, "-m", "router", "check", str(path)], capture_output=True, text=True, check=True
    )
    assert f"tls: verify against {ca.ca_file}, name vllm.internal" in done.stdout
    assert done.stdout.count("tls:") == 1  # the plain-HTTP pool has none
