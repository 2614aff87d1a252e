#!/usr/bin/env bash
# Installs amtool (Debian's prometheus-alertmanager package) when missing.
# Sourced by ops/check-prometheus.sh: amtool checks the Alertmanager example
# (ops/prometheus/alertmanager.yml).
if ! command -v amtool >/dev/null 2>&1; then
  echo "amtool not found: installing Debian's prometheus-alertmanager package" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus-alertmanager >/dev/null
  # Where systemd runs, the package also starts a system service on :9093;
  # only its amtool is used here.
fi
