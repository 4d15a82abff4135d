"""Finding the external checkers: a missing promtool skips locally and fails in CI, naming the fix."""

from __future__ import annotations

import re
import shutil

import pytest

from tests.deploy.tools import INSTALL_SCRIPT, REPO, REQUIRE_ENV, require_tool


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


def test_the_install_script_provides_every_system_tool_the_tests_require() -> None:
    script = (REPO / INSTALL_SCRIPT).read_text(encoding="utf-8")
    installed = {line.split()[1] for line in script.splitlines() if line.startswith("apt_install ")}
    required: set[str] = set()
    for path in (REPO / "tests").rglob("*.py"):
        required |= set(re.findall(r'require_tool\("([\w.-]+)"\)', path.read_text(encoding="utf-8")))
    assert {"promtool", "redis-server"} <= required  # the search finds what it should
    assert sorted(required - installed) == []
