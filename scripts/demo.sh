#!/usr/bin/env bash
# Set up the project venv and run the embedded demo: simulated vLLM pools, the router in front
# of them with the class-aware profile, and a short six-class mixed-traffic run.
# Extra arguments go to `lane-router demo` (see `lane-router demo --help`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[lab]'
exec .venv/bin/lane-router demo "$@"
