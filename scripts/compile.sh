#!/usr/bin/env bash
# Compile the request path of this source tree in place with mypyc (the modules listed under
# `[tool.lane-router] compiled` in pyproject.toml; docs/compiled.md). Takes 1–3 minutes. The
# extensions sit beside their sources and are imported first; a source edited afterwards makes
# the package load every module from source, with a warning, until this runs again.
#
# Usage: scripts/compile.sh              compile (needs a C compiler and the project venv)
#        scripts/compile.sh --if-needed  only if a listed module is missing or older than its source
#        scripts/compile.sh --clean      remove the compiled modules: the tree runs interpreted
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv/bin/python

clean() {
  find router -name '*.so' -delete
  rm -rf build/mypyc
}

# Current: every module of the list compiled, none older than its source.
current() {
  LANE_ROUTER_INTERPRETED= "$PY" - <<'PYTHON'
import sys
from pathlib import Path
import router
from router.compiled import extensions, listed
here = Path.cwd()
built = {str(source.relative_to(here)) for source in extensions(here / "router")}
sys.exit(0 if router.BUILD.mode == "compiled" and built == set(listed(here)) else 1)
PYTHON
}

[[ -x $PY ]] || { echo "compile.sh: $PY missing: create the project venv first" >&2; exit 1; }
case "${1:-}" in
  --clean) clean; echo "compiled modules removed: the tree runs interpreted"; exit 0 ;;
  --if-needed) if current; then echo "compile.sh: the request path is compiled and current"; exit 0; fi ;;
  "") ;;
  -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
  *) echo "compile.sh: unknown argument $1 (--if-needed, --clean, --help)" >&2; exit 2 ;;
esac

command -v cc >/dev/null || { echo "compile.sh: no C compiler (cc) on PATH (Debian: gcc libc6-dev)" >&2; exit 1; }
"$PY" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  || { echo "compile.sh: the Python headers (Python.h) are missing (Debian: python3.11-dev)" >&2; exit 1; }
clean
started=$(date +%s)
mkdir -p build
LANE_ROUTER_COMPILE=1 "$PY" setup.py -q build_ext --inplace --build-temp build/mypyc \
  -j "$(nproc)" >build/compile.log 2>&1 || {
  tail -30 build/compile.log >&2
  echo "compile.sh: the build failed (whole log: build/compile.log)" >&2
  exit 1
}
"$PY" -c 'import router; print("lane-router request path:", router.BUILD.describe())'
echo "compiled in $(( $(date +%s) - started ))s"
