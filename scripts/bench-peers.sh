#!/usr/bin/env bash
# Side-by-side proxy benchmark: lane-router, vLLM Router, nginx, a bare asyncio + httptools Python
# proxy and no proxy at all, in front of the same fake backends on 127.0.0.1, each proxy alone on
# CPU 1 and the backends and load generators on CPU 0. Prints one markdown table of proxy CPU per
# request and per chunk, core use and added time to first token, with the load average.
# The targets take turns in rounds (3 by default) whose order rotates, so drift of the machine
# falls on all of them alike. Takes about 6 minutes; every load is bounded and every process is
# stopped at the end.
#
# Installs what a chosen target needs and is missing (reused afterwards):
#   - vLLM Router 0.1.17 (pip package `vllm-router`) in a venv under ~/.cache/lane-router/peers/;
#   - nginx and wrk, Debian packages, with apt-get (root or sudo; no system service is started).
#
# Usage: scripts/bench-peers.sh [options of python -m router.lab.bench.peers]
#   --targets lane-router,vllm-router,nginx,bare,direct   run only these
#   --scenarios nonstream,stream,paced                     run only these
#   --lane-router-src DIR (repeatable)                     compare other source trees
#   --scale F                                              longer or shorter loads
#   --rounds N                                             turns per target (default 3)
#   --together                                             each round's loads through all targets at once
#                                                          (two targets: CPU 0 carries every load generator)
# Env: LANE_ROUTER_PEERS_DIR (default ~/.cache/lane-router/peers), PYTHON (for the venv: python3.11)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VLLM_ROUTER_VERSION="0.1.17"
PEERS="${LANE_ROUTER_PEERS_DIR:-$HOME/.cache/lane-router/peers}"
VENV="$PEERS/vllm-router-$VLLM_ROUTER_VERSION"
PYTHON="${PYTHON:-python3.11}"
RUNNER="$REPO/.venv/bin/python"

log() { printf '[bench-peers %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fail() { printf '[bench-peers] ERROR: %s\n' "$*" >&2; exit 1; }

for arg in "$@"; do
  case "$arg" in -h|--help) sed -n '2,22p' "$0"; exit 0 ;; esac
done

# wants KIND: true when the run's --targets (default: all) include KIND.
TARGETS=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --targets) TARGETS="${args[i + 1]:-}" ;;
    --targets=*) TARGETS="${args[i]#--targets=}" ;;
  esac
done
wants() { [[ -z $TARGETS || ",$TARGETS," == *",$1,"* ]]; }

as_root() {
  if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

# apt_install TOOL PACKAGE: install PACKAGE unless TOOL is already on PATH.
apt_install() {
  local tool=$1 package=$2
  if command -v "$tool" >/dev/null; then return; fi
  log "apt-get install $package"
  # nginx ships a service; policy-rc.d answering 101 keeps the package scripts from starting it
  # (the benchmark runs its own nginx in the foreground).
  local policy=/usr/sbin/policy-rc.d added=0 status=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' | as_root tee "$policy" >/dev/null
    as_root chmod 755 "$policy"
    added=1
  fi
  {
    as_root apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "$package" >/dev/null
  } || status=$?
  if [[ $added -eq 1 ]]; then as_root rm -f "$policy"; fi
  [[ $status -eq 0 ]] || fail "apt-get install $package failed (exit $status)"
  command -v "$tool" >/dev/null || fail "$tool not on PATH after installing $package"
}

# A venv counts as complete once the pinned version is installed in it.
install_vllm_router() {
  local have=""
  if [[ -x $VENV/bin/vllm-router ]]; then
    have=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-router"))' 2>/dev/null || true)
  fi
  [[ $have == "$VLLM_ROUTER_VERSION" ]] && return
  command -v "$PYTHON" >/dev/null || PYTHON=python3
  log "pip install vllm-router==$VLLM_ROUTER_VERSION into $VENV"
  rm -rf "$VENV"
  mkdir -p "$PEERS"
  "$PYTHON" -m venv "$VENV" || fail "could not create the venv $VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "vllm-router==$VLLM_ROUTER_VERSION" \
    || fail "pip install vllm-router==$VLLM_ROUTER_VERSION failed"
}

[[ -x $RUNNER ]] || fail "$RUNNER missing: create the project venv first (pip install -e '.[dev]')"
command -v taskset >/dev/null || fail "taskset (util-linux) not found"
if wants vllm-router; then install_vllm_router; fi
if wants nginx; then apt_install nginx nginx; fi
apt_install wrk wrk

# The harness sits on the load core; it starts each proxy under taskset on the proxy core.
cd "$REPO"
exec taskset -c 0 env PYTHONPATH="$REPO" "$RUNNER" -m router.lab.bench.peers \
  --vllm-router "$VENV/bin/vllm-router" --command "scripts/bench-peers.sh${*:+ $*}" "$@"
