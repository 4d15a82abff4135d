"""Route scopes of keys (`keys[].routes`) and the response-id memory's settings."""

from __future__ import annotations

from typing import Any

from router.config import parse_profile
from router.config.models import DEFAULT_ROUTES, RouteScope
from router.keys.auth import build_keys
from tests.config.test_load import issues_of, mutated


def _routes(routes: Any) -> dict[str, Any]:
    return mutated(lambda data: data["keys"][0].update(routes=routes))


def test_a_key_without_routes_keeps_the_routes_every_key_had() -> None:
    cfg = parse_profile(mutated(lambda data: None))
    (key, *_) = build_keys(cfg.keys, {"NIGHTLY_KEY_SHA256": "0" * 63 + "1"})
    assert (
        key.routes
        == frozenset(DEFAULT_ROUTES)
        == {RouteScope.CHAT, RouteScope.COMPLETIONS, RouteScope.EMBEDDINGS}
    )


def test_a_keys_routes_are_its_own() -> None:
    cfg = parse_profile(_routes(["responses", "audio"]))
    assert cfg.keys[0].routes == (RouteScope.RESPONSES, RouteScope.AUDIO)


def test_unknown_or_empty_routes_are_reported_with_their_path() -> None:
    ((path, message),) = issues_of(_routes(["chat", "invocations"]))
    assert path == "keys[0].routes[1]"
    assert "responses" in message and "tokenize" in message
    ((path, _),) = issues_of(_routes([]))
    assert path == "keys[0].routes"


def test_response_id_settings_are_bounded() -> None:
    paths = {
        p for p, _ in issues_of(mutated(lambda d: d.update(response_ids={"ttl_s": 0, "max_entries": 1})))
    }
    assert paths == {"response_ids.ttl_s", "response_ids.max_entries"}
