"""What the HTTP server is told: its limits, timeouts and the few things it needs from the app
it runs. One frozen object, built once (router/server.py builds it from `Settings`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# A client that needs longer than this for one request head is either broken or an attacker;
# the setting may only shorten it.
HEAD_TIMEOUT_MAX_S: Final = 30.0


@dataclass(frozen=True, slots=True)
class ServerConfig:
    # Request line plus headers, counted as bytes fed to the parser: beyond it a head is refused
    # (431) before anything is accumulated, so an endless header costs at most this much memory.
    # A chunked body's trailer, and each of its chunk size lines, is held to it as well.
    max_head_bytes: int = 64 * 1024
    max_headers: int = 100
    # From connect (or from the first byte after a kept-alive response) to a complete head; it
    # also closes a connection that never sends a byte.
    head_timeout_s: float = 10.0
    # Between requests on a kept-alive connection. Longer than common clients' own expiry, so
    # the client, not the server, ends an idle connection and never reuses one being closed.
    keepalive_timeout_s: float = 30.0
    # Silence while a request body is expected and the app is ready to take it.
    body_timeout_s: float = 30.0
    max_connections: int = 10_000  # 0: no limit
    # Request body bytes held for the app before reading from the socket pauses.
    body_buffer_bytes: int = 64 * 1024
    graceful_shutdown_s: float = 30.0
    # Written as a last chunk into an event stream cut at shutdown, before its terminator.
    shutdown_event: bytes = b""
    # App exceptions that mean "drop this connection" and that the app has already reported.
    quiet_errors: tuple[type[BaseException], ...] = ()
    access_log: bool = False
    backlog: int = 4096
    # (level, option, value) for setsockopt on every accepted socket, after TCP_NODELAY.
    socket_options: tuple[tuple[int, int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.max_head_bytes < 1024:
            raise ValueError("max_head_bytes must be at least 1024")
        if self.max_headers < 1:
            raise ValueError("max_headers must be at least 1")
        if not 0 < self.head_timeout_s <= HEAD_TIMEOUT_MAX_S:
            raise ValueError(f"head_timeout_s must be in (0, {HEAD_TIMEOUT_MAX_S:g}]")
        for name in ("keepalive_timeout_s", "body_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.max_connections < 0 or self.graceful_shutdown_s < 0 or self.body_buffer_bytes < 1:
            raise ValueError("max_connections and graceful_shutdown_s must be ≥ 0, body_buffer_bytes ≥ 1")
