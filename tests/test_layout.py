"""The rooms of the package hold: serving loads neither the lab nor the deployment renderers, and
the router's image contains neither.

Each check runs in a fresh interpreter, so nothing another test imported counts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from fnmatch import fnmatch
from pathlib import Path

import pytest

from tests.support.profiles import profile

REPO = Path(__file__).resolve().parents[1]
OUTSIDE_SERVING = ("router.lab", "router.deploy")

# Builds the app as `lane-router serve --config FILE` does, through the command line, up to the
# one step that would bind a port: `router.server.run` is replaced by one that keeps the app.
SERVE = """
import json, sys
import router.server
built = {}
router.server.run = lambda app, settings, tls=None: built.update(app=app, settings=settings)
from router.cli import main
code = main(["serve", "--config", sys.argv[1], "--port", "0"])
app = built["app"]
print(json.dumps({
    "code": code,
    "app": type(app).__name__,
    "lanes": sorted(lane.name for lane in app.state.runtime.lanes.values()),
    "loaded": sorted(m for m in sys.modules if m.startswith(("router.lab", "router.deploy"))),
}))
"""

HELP = """
import contextlib, io, json, sys
from router.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
    main(sys.argv[1:])
print(json.dumps({
    "help": out.getvalue(),
    "loaded": sorted(m for m in sys.modules if m.startswith(("router.lab", "router.deploy"))),
}))
"""


def _python(script: str, *args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_serve_builds_the_app_without_the_lab_or_the_renderers(tmp_path: Path) -> None:
    import yaml

    config = tmp_path / "profile.yaml"
    config.write_text(yaml.safe_dump(profile(["http://127.0.0.1:9"])))
    result = _python(SERVE, str(config))
    assert result["code"] == 0 and result["app"] == "LaneRouterApp"
    assert result["lanes"] == sorted(["chat", "rag", "long_context", "agent", "batch", "slow_stream"])
    assert result["loaded"] == []


@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"], ["evidence", "--help"]])
def test_help_loads_neither_the_lab_nor_the_renderers(argv: list[str]) -> None:
    result = _python(HELP, *argv)
    assert result["loaded"] == []
    assert "usage: lane-router" in str(result["help"])


def test_top_level_help_lists_every_subcommand() -> None:
    from router.cli import COMMANDS

    text = str(_python(HELP, "--help")["help"])
    for command in COMMANDS:
        assert command.name in text


def _image_context(dest: Path) -> Path:
    """A copy of the repository holding what .dockerignore lets into the router's image."""
    rules = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    readmitted = [rule.removeprefix("!").rstrip("/") for rule in rules if rule.startswith("!")]
    for root, dirs, files in os.walk(REPO):
        here = Path(root).relative_to(REPO).as_posix().removeprefix(".")
        # A folder nothing may come back from is not walked (.git, .venv, tests, router/lab, …).
        dirs[:] = [
            d
            for d in dirs
            if _admitted(f"{here}/{d}".lstrip("/"), rules)
            or any(r.startswith(f"{here}/{d}".lstrip("/") + "/") for r in readmitted)
        ]
        for name in files:
            rel = f"{here}/{name}".lstrip("/")
            if _admitted(rel, rules):
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / rel, dest / rel)
    return dest


def _admitted(rel: str, rules: list[str]) -> bool:
    """Docker's rule: the last matching pattern decides; `!` lets a path back in."""
    admitted = True
    for rule in rules:
        negated = rule.startswith("!")
        pattern = rule.removeprefix("!").rstrip("/")
        parts = rel.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch(p, pattern) or fnmatch(p, pattern.removeprefix("**/")) for p in prefixes):
            admitted = negated
    return admitted


def test_the_router_image_installs_neither_the_lab_nor_the_renderers(tmp_path: Path) -> None:
    context = _image_context(tmp_path / "context")
    assert (context / "router" / "server.py").is_file()
    assert not (context / "router" / "lab").exists() and not (context / "router" / "deploy").exists()
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(wheels),
            str(context),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("lane_router-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "router/server.py" in names and "router/cli.py" in names
    assert not [n for n in names if n.startswith(("router/lab/", "router/deploy/"))]


def test_the_import_contract_covers_every_proxy_module() -> None:
    """The contract names the proxy's folders and flat modules; a new one must join it."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (proxy,) = [c for c in contracts if set(c.get("forbidden_modules", ())) == set(OUTSIDE_SERVING)]
    top = {
        f"router.{p.stem if p.is_file() else p.name}"
        for p in (REPO / "router").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    assert set(proxy["source_modules"]) == top - {"router.lab", "router.deploy"}
