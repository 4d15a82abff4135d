from __future__ import annotations

import hashlib

from router.config.load import parse_profile
from router.config.models import ProfileConfig, RequestClass
from router.evidence.boundary import key_scopes, security_boundary_note
from tests.evidence.factories import profile_a


def _profile(keys: list[dict[str, object]], pool_key: bool = True) -> ProfileConfig:
    pools: dict[str, dict[str, object]] = {
        "fast": {"backends": ["http://127.0.0.1:9001"], "model": "m-fast"},
        "bulk": {"backends": ["http://127.0.0.1:9002"], "model": "m-fast"},
    }
    if pool_key:
        pools["fast"]["upstream_api_key_env"] = "FAST_KEY"
    lanes = {cls.value: {"pool": "bulk" if cls is RequestClass.BATCH else "fast"} for cls in RequestClass}
    return parse_profile({"pools": pools, "lanes": lanes, "keys": keys})


def _key(name: str, **scopes: object) -> dict[str, object]:
    return {"name": name, "sha256": hashlib.sha256(name.encode()).hexdigest(), **scopes}


def test_the_note_states_routes_scopes_and_the_upstream_boundary() -> None:
    cfg = _profile([_key("web"), _key("grafana", metrics=True), _key("ops", admin=True)])
    lines = security_boundary_note(cfg).splitlines()
    assert len(lines) == 5
    for route in (
        "POST /v1/chat/completions",
        "POST /v1/completions",
        "POST /v1/embeddings",
        "GET /v1/models",
    ):
        assert route in lines[0]
    assert "never forwarded" in lines[0]
    assert "GET /health, GET /ready (no key, status only)" in lines[1]
    assert "GET /metrics (admin or metrics scope)" in lines[1]
    assert "/admin/* (admin scope)" in lines[1]
    assert lines[2] == "key scopes: inference: web, grafana, ops; metrics: grafana, ops; admin: ops"
    assert lines[3].startswith("vLLM --api-key covers only /v1/*")
    assert "/tokenize" in lines[3] and "unreachable through the router" in lines[3]
    assert lines[4].endswith("upstream key set for pools: fast; no upstream key for pools: bulk")


def test_the_note_is_a_pure_function_of_the_profile() -> None:
    keys = [_key("web"), _key("ops", admin=True)]
    assert security_boundary_note(_profile(keys)) == security_boundary_note(_profile(keys))
    more = [_key("web", metrics=True), _key("ops", admin=True)]
    assert security_boundary_note(_profile(more)) != security_boundary_note(_profile(keys))
    assert security_boundary_note(_profile(keys, pool_key=False)) != security_boundary_note(_profile(keys))


def test_a_profile_without_keys_says_so() -> None:
    note = security_boundary_note(_profile([]))
    assert "key scopes: no keys configured, so every keyed route refuses" in note.splitlines()


def test_key_scopes_map_scopes_to_holders() -> None:
    scopes = key_scopes(profile_a().keys)
    assert scopes == {"inference": ("web", "ops"), "metrics": ("ops",), "admin": ("ops",)}
    cfg = _profile([_key("web")])
    assert key_scopes(cfg.keys) == {"inference": ("web",), "metrics": (), "admin": ()}
    assert "metrics: (none); admin: (none)" in security_boundary_note(cfg)
