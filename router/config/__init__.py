"""The profile file: models, cross-checks, loading, vLLM settings and their hash."""

from __future__ import annotations

from router.config.checks import ConfigIssue
from router.config.load import ConfigError, load_profile, parse_profile
from router.config.models import (
    ALL_CLASSES,
    ClassifyConfig,
    KeyConfig,
    LaneConfig,
    PoolConfig,
    ProfileConfig,
    RequestClass,
)
from router.config.vllm import VllmSettings, server_configuration_hash

__all__ = [
    "ALL_CLASSES",
    "ClassifyConfig",
    "ConfigError",
    "ConfigIssue",
    "KeyConfig",
    "LaneConfig",
    "PoolConfig",
    "ProfileConfig",
    "RequestClass",
    "VllmSettings",
    "load_profile",
    "parse_profile",
    "server_configuration_hash",
]
