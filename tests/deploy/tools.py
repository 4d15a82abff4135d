"""External checkers for the deployment files, and where the tests find them.

hadolint, kubernetes-validate and the compose-spec schema (vendored by check-jsonschema) come with
the dev extras. promtool (and redis-server, for the shared-state tests) come from Debian
(scripts/install-ci-tools.sh): without them the checks skip, unless LANE_ROUTER_REQUIRE_TOOLS=1
(as in CI), where a missing tool fails them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
EXAMPLE_PROFILE = DEPLOY / "example-profile.yaml"
REQUIRE_ENV = "LANE_ROUTER_REQUIRE_TOOLS"
INSTALL_SCRIPT = "scripts/install-ci-tools.sh"
K8S_VERSIONS = ("1.30.0", "1.37.0")


def require_tool(name: str) -> str:
    found = shutil.which(name)
    if found is not None:
        return found
    message = f"{name} not found on PATH: install it with `bash {INSTALL_SCRIPT}`"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 and {message}", pytrace=False)
    pytest.skip(message)


def venv_tool(name: str) -> str:
    """A console script installed beside this interpreter by the dev extras."""
    path = Path(sys.executable).parent / name
    assert path.is_file(), f"{path} missing: pip install -e '.[dev]'"
    return str(path)


def run(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def compose_schema() -> dict[str, Any]:
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    schema: dict[str, Any] = json.loads((vendor / "compose-spec.json").read_text(encoding="utf-8"))
    return schema


def check_promql(promtool: str, queries: list[str], folder: Path) -> subprocess.CompletedProcess[str]:
    """promtool's verdict on queries, each read as the expression of a recording rule."""
    records = [{"record": f"check:query_{i}", "expr": q} for i, q in enumerate(queries)]
    path = folder / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "queries", "rules": records}]}), encoding="utf-8")
    return run(promtool, "check", "rules", str(path))
