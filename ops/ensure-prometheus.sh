#!/usr/bin/env bash
# Installs prometheus and promtool (Debian's prometheus package) when missing.
# Sourced by ops/test.sh and .ci/run: promtool checks the alert rules, and an
# integration test starts its own prometheus on a free loopback port.
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  echo "prometheus not found: installing Debian's prometheus package" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  # Where systemd runs, the package also starts a system service on :9090.
  # seatgate's tests never use it: each starts its own on a free port.
fi
