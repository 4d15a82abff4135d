"""Finding the external checkers: a missing promtool skips locally and fails in CI, naming the fix."""

from __future__ import annotations

import shutil

import pytest

from tests.deploy.tools import INSTALL_SCRIPT, REQUIRE_ENV, require_tool


def test_a_missing_tool_fails_when_tools_are_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv(REQUIRE_ENV, "1")

    with pytest.raises(
        pytest.fail.Exception, match=f"promtool not found on PATH: install it with `bash {INSTALL_SCRIPT}`"
    ):
        require_tool("promtool")


def test_a_missing_tool_skips_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv(REQUIRE_ENV, raising=False)

    with pytest.raises(pytest.skip.Exception, match=INSTALL_SCRIPT):
        require_tool("promtool")
