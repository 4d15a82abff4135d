"""Process-level settings from the environment (`LANE_ROUTER_*`); the profile file holds the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LANE_ROUTER_", extra="ignore", frozen=True)

    config: Path | None = Field(None, description="profile file; none → the embedded demo profile")
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = False
    watch_config: bool = True
    watch_interval_s: float = Field(1.0, gt=0)
    graceful_shutdown_s: float = Field(30.0, ge=0)
