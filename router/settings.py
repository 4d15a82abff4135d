"""Process-level settings from the environment (`LANE_ROUTER_*`); the profile file holds the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from router.httpserver.config import HEAD_TIMEOUT_MAX_S


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="LANE_ROUTER_", extra="ignore", frozen=True, populate_by_name=True
    )

    config: Path | None = Field(None, description="profile file; none → the embedded demo profile")
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = False
    # The JSON access log (router/observe/accesslog.py): a file appended to, or "-" for stderr.
    access_log_file: str | None = Field(None, description='one JSON line per proxied request; "-": stderr')
    access_log_queue: int = Field(
        10_000, ge=2, description="lines waiting for the writer thread; past it lines are dropped and counted"
    )
    watch_config: bool = True
    watch_interval_s: float = Field(1.0, gt=0)
    graceful_shutdown_s: float = Field(30.0, ge=0)
    # The HTTP server's limits (router/httpserver/config.py), all enforced before the app runs.
    max_head_bytes: int = Field(64 * 1024, ge=1024, description="request line + headers; 431 above")
    max_headers: int = Field(100, ge=1, description="header fields of one request; 431 above")
    head_timeout_s: float = Field(
        10.0, gt=0, le=HEAD_TIMEOUT_MAX_S, description="connect (or keep-alive reuse) to a complete head"
    )
    keepalive_timeout_s: float = Field(30.0, gt=0, description="idle time between requests")
    body_timeout_s: float = Field(30.0, gt=0, description="silence while a request body is due")
    max_connections: int = Field(10_000, ge=0, description="open client connections; 0: no limit")
    # TLS on the listener (router/tls/serving.py): re-read on SIGHUP; with a client CA every client
    # must show a certificate it signed (mTLS).
    tls_cert: Path | None = Field(None, description="PEM certificate chain served to clients")
    tls_key: Path | None = Field(None, description="PEM private key of tls_cert")
    tls_client_ca: Path | None = Field(None, description="PEM CA bundle client certificates must chain to")
    # Several processes on one port (router/supervisor/workers.py): N workers under a supervising parent.
    workers: int = Field(1, ge=1, le=256, description="worker processes; 1: this process serves alone")
    worker_sockets: Literal["reuseport", "inherit"] = Field(
        "reuseport",
        description="reuseport: each worker binds its own SO_REUSEPORT socket and the kernel spreads "
        "connections; inherit: the workers accept on the one socket the parent bound",
    )
    # Set by the supervisor for each worker it starts, never by hand.
    worker_index: int | None = Field(None, ge=0, description="this worker's number, 0..workers-1")
    worker_channel_fd: int | None = Field(None, ge=0, description="the worker's socket to its parent")
    listen_fd: int | None = Field(None, ge=0, description="the listening socket inherited from the parent")
    run_dir: Path | None = Field(None, description="the workers' private directory (metrics sockets)")

    # Tracing (router/observe/observer.py) reads the standard OpenTelemetry variables, unprefixed.
    otel_sdk_disabled: str | None = Field(None, validation_alias="OTEL_SDK_DISABLED")
    otel_traces_exporter: str | None = Field(None, validation_alias="OTEL_TRACES_EXPORTER")
    otel_exporter_otlp_endpoint: str | None = Field(None, validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT")
    otel_exporter_otlp_traces_endpoint: str | None = Field(
        None, validation_alias="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    otel_exporter_otlp_protocol: str | None = Field(None, validation_alias="OTEL_EXPORTER_OTLP_PROTOCOL")
    otel_exporter_otlp_traces_protocol: str | None = Field(
        None, validation_alias="OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    )
    otel_service_name: str | None = Field(None, validation_alias="OTEL_SERVICE_NAME")

    @model_validator(mode="after")
    def _tls_files(self) -> Settings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both a certificate and its key (--tls-cert and --tls-key)")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("--tls-client-ca needs TLS on the listener (--tls-cert and --tls-key)")
        return self

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def is_worker(self) -> bool:
        return self.worker_index is not None
