"""The build's one dynamic part: with LANE_ROUTER_COMPILE=1 the request path's modules (pyproject
`[tool.lane-router] compiled`) are compiled with mypyc into extensions beside their sources;
without it the package is pure Python. Everything else about the package is in pyproject.toml.

    LANE_ROUTER_COMPILE=1 pip install .         # a compiled install (a C compiler is needed)
    bash scripts/compile.sh                     # compile a source tree in place
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from setuptools import setup

HERE = Path(__file__).resolve().parent


def compiled_modules() -> list[str]:
    with (HERE / "pyproject.toml").open("rb") as f:
        modules: list[str] = tomllib.load(f)["tool"]["lane-router"]["compiled"]
    return modules


def ext_modules() -> list[Any]:
    if os.environ.get("LANE_ROUTER_COMPILE", "") in ("", "0"):
        return []
    from mypyc.build import mypycify

    # The modules share one runtime library, named inside the package (router/request_path__mypyc)
    # so that an editable install, which puts only the package on the path, finds it.
    return list(
        mypycify(
            compiled_modules(), opt_level="3", group_name="router.request_path", target_dir="build/mypyc"
        )
    )


setup(ext_modules=ext_modules())
