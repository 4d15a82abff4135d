"""Whether the request path runs compiled, and the way back to its sources.

The modules listed under `[tool.lane-router] compiled` in pyproject.toml can be compiled with
mypyc (`scripts/compile.sh`, or `LANE_ROUTER_COMPILE=1` when a wheel is built; docs/compiled.md).
A compiled module is an extension beside its `.py`, and Python imports the extension first. Two
cases need the sources instead, and get every module of the package from them: an operator who
sets LANE_ROUTER_INTERPRETED=1, and a source tree where a `.py` changed after it was compiled
(the extension would run the old code). They are all or nothing because compiled modules call
each other directly, not through the import system: one module loaded from source would not be
the code its compiled callers run."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import tomllib
from collections.abc import Mapping, Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

INTERPRETED_ENV = "LANE_ROUTER_INTERPRETED"
_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)


class Build(NamedTuple):
    """How this process loads the package: `mode` is "compiled", "interpreted" (no extension
    present) or "sources" (extensions present, bypassed); `reason` says why they were bypassed."""

    mode: str
    extensions: int
    reason: str = ""

    def describe(self) -> str:
        if self.mode == "compiled":
            return f"compiled ({self.extensions} modules)"
        if self.mode == "sources":
            return f"interpreted: {self.extensions} compiled modules bypassed ({self.reason})"
        return "interpreted"


def listed(project_dir: Path) -> list[str]:
    """The modules a source tree's pyproject.toml lists to compile, as paths from `project_dir`
    (setup.py reads the same list, without importing the package)."""
    with (project_dir / "pyproject.toml").open("rb") as f:
        modules: list[str] = tomllib.load(f)["tool"]["lane-router"]["compiled"]
    return modules


def extensions(package_dir: Path) -> dict[Path, Path]:
    """Each compiled module of the package, keyed by its source file."""
    found: dict[Path, Path] = {}
    for path in package_dir.rglob("*.so"):
        for suffix in _SUFFIXES:
            if path.name.endswith(suffix):
                source = path.with_name(path.name[: -len(suffix)] + ".py")
                if source.exists():
                    found[source] = path
                break
    return found


def stale(package_dir: Path, found: Mapping[Path, Path]) -> list[str]:
    """In a source tree (pyproject.toml beside the package), the sources changed after their
    module was compiled. An installed package is not checked: an installer writes its files in
    no particular order."""
    if not (package_dir.parent / "pyproject.toml").exists():
        return []
    return sorted(
        str(source.relative_to(package_dir.parent))
        for source, ext in found.items()
        if source.stat().st_mtime > ext.stat().st_mtime
    )


def choose(package_dir: Path, environ: Mapping[str, str]) -> Build:
    """How the package should load here (pure: nothing is installed)."""
    found = extensions(package_dir)
    if not found:
        return Build("interpreted", 0)
    if environ.get(INTERPRETED_ENV, "") not in ("", "0"):
        return Build("sources", len(found), f"{INTERPRETED_ENV} is set")
    changed = stale(package_dir, found)
    if changed:
        shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
        return Build("sources", len(found), f"changed since compiled: {shown}; scripts/compile.sh rebuilds")
    return Build("compiled", len(found))


class SourcesFirst:
    """An import finder (sys.meta_path) that loads `package`'s modules from their `.py` files, even
    where an extension sits beside one."""

    def __init__(self, package: str) -> None:
        self.package = package
        self._prefix = package + "."

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if not fullname.startswith(self._prefix) or not path:
            return None
        leaf = fullname.rpartition(".")[2]
        for entry in path:
            source = os.path.join(entry, leaf + ".py")
            if os.path.isfile(source):
                return importlib.util.spec_from_file_location(fullname, source)
        return None


def apply(package: str, package_dir: Path, environ: Mapping[str, str]) -> Build:
    """Decide how `package` loads and, for its sources, put the finder first on the import path."""
    build = choose(package_dir, environ)
    finders = sys.meta_path
    if build.mode == "sources" and not any(
        isinstance(f, SourcesFirst) and f.package == package for f in finders
    ):
        finders.insert(0, SourcesFirst(package))
    return build
