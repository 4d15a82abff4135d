"""The server's settings: validated limits, and the router's wiring of them from `Settings`."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from router.httpserver import HEAD_TIMEOUT_MAX_S, ServerConfig
from router.proxy.respond import ResponseAborted
from router.server import server_config
from router.settings import Settings


def test_defaults() -> None:
    config = ServerConfig()
    assert (config.max_head_bytes, config.max_headers) == (64 * 1024, 100)
    assert (config.head_timeout_s, config.keepalive_timeout_s, config.body_timeout_s) == (10, 30, 30)
    assert config.max_connections == 10_000


@pytest.mark.parametrize(
    "bad",
    [
        {"head_timeout_s": HEAD_TIMEOUT_MAX_S + 1},
        {"head_timeout_s": 0},
        {"max_head_bytes": 100},
        {"max_headers": 0},
        {"keepalive_timeout_s": 0},
        {"body_timeout_s": -1},
        {"max_connections": -1},
    ],
)
def test_out_of_range_limits_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ServerConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        Settings.model_validate(bad)


def test_the_router_passes_its_settings_and_its_stream_ending(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LANE_ROUTER_HEAD_TIMEOUT_S", "5")
    monkeypatch.setenv("LANE_ROUTER_MAX_HEADERS", "50")
    config = server_config(Settings(keepalive_timeout_s=12, graceful_shutdown_s=3))
    assert (config.head_timeout_s, config.max_headers) == (5, 50)
    assert (config.keepalive_timeout_s, config.graceful_shutdown_s) == (12, 3)
    assert config.quiet_errors == (ResponseAborted,)
    assert config.shutdown_event.startswith(b"data: {")
    assert b'"code":"server_shutdown"' in config.shutdown_event
    assert config.shutdown_event.endswith(b"\n\n")
