#!/usr/bin/env bash
# Runs the whole test suite. Tests start their own redis-server (and
# prometheus, and for the status page a headless chromium) processes on free
# loopback ports, an Alertmanager for its example configuration, run the
# Python examples with redis-py, and install and purge the Debian package
# (as root: dpkg); this script only makes sure those are installed, checks
# the alert rules and builds the package first.
set -euo pipefail
cd "$(dirname "$0")/.."
source ops/ensure-redis.sh
source ops/ensure-prometheus.sh
source ops/ensure-alertmanager.sh
source ops/ensure-chromium.sh
source ops/ensure-python.sh
bash ops/check-prometheus.sh
# The Debian package (release build, cargo-deb) before the suite rather than
# inside it, where its minutes of compiling would slow the timing-sensitive
# tests; tests/it/package.rs then only repackages it and installs it.
bash ops/package-deb.sh >/dev/null
cargo test --locked "$@"
