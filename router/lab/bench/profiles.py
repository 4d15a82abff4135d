"""Profiles as the lab runs them: read from their files, optionally with settings changed for an
experiment (`--set PATH=VALUE`; each change is printed in the report's command line).

A PATH is dotted; `*` stands for every key of a mapping: `pools.*.vllm.max_model_len=32768`
sets it in every pool, `slow_clients.lag_bytes=16384` sets a top-level section. A named pool
the profile does not have (`pools.large.…` in a one-pool profile) is left out, not created.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from router.config.load import parse_profile
from router.config.models import ProfileConfig

Override = tuple[str, str]


def parse_override(text: str) -> Override:
    """`pools.*.vllm.max_model_len=32768` → ("pools.*.vllm.max_model_len", "32768")."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or any(not part for part in key.strip().split(".")):
        raise ValueError(f"expected PATH=VALUE with a dotted PATH, got {text!r}")
    return key.strip(), value.strip()


def load_profile_data(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a profile is a mapping")
    return data


def _set(node: dict[str, Any], parts: Sequence[str], value: Any, under: tuple[str, ...]) -> None:
    head, rest = parts[0], parts[1:]
    keys = list(node) if head == "*" else [head]
    for key in keys:
        if not rest:
            node[key] = copy.deepcopy(value)
            continue
        child = node.get(key)
        if child is None:
            if under == ("pools",):
                continue  # a pool this profile does not have
            child = node[key] = {}
        if isinstance(child, dict):
            _set(child, rest, value, (*under, key))


def with_settings(data: Mapping[str, Any], overrides: Sequence[Override]) -> dict[str, Any]:
    """`data` with every `PATH=VALUE` applied (values read as YAML)."""
    out = copy.deepcopy(dict(data))
    for path, value in overrides:
        _set(out, path.split("."), yaml.safe_load(value), ())
    return out


def lab_profile(path: Path, overrides: Sequence[Override] = ()) -> tuple[dict[str, Any], ProfileConfig]:
    """The profile file's mapping (overrides applied) and its validated configuration."""
    data = with_settings(load_profile_data(path), overrides)
    return data, parse_profile(data, str(path))
