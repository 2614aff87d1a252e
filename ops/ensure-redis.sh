#!/usr/bin/env bash
# Installs redis-server (Debian's package, built with TLS), the openssl CLI
# (the TLS tests make their own CA with it) and libfaketime when they are missing. Sourced by
# the other ops scripts and by .ci/run.
missing=()
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  missing+=(redis-server redis-tools)
fi
if ! command -v openssl >/dev/null 2>&1; then
  missing+=(openssl)
fi
# libfaketime: tests/it/metrics.rs runs a worker with its clock set ahead.
if [ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ]; then
  missing+=(faketime)
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing Debian's ${missing[*]} package(s)" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  # redis-server's package starts a system service on 6379; seatgate's tests never use it.
fi
unset missing
