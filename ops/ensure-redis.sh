#!/usr/bin/env bash
# Installs redis-server (Debian's package) when it is missing. Sourced by the
# other ops scripts and by .ci/run.
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "redis-server not found: installing Debian's redis-server package" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server redis-tools >/dev/null
  # The package starts a system service on 6379; seatgate's tests never use it.
fi
