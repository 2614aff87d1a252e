#!/usr/bin/env bash
# Runs the whole test suite. Tests start their own redis-server (and
# prometheus, and for the status page a headless chromium) processes on free
# loopback ports, an Alertmanager for its example configuration, and run the
# Python examples with redis-py; this script only
# makes sure those are installed, and checks the alert rules first.
set -euo pipefail
cd "$(dirname "$0")/.."
source ops/ensure-redis.sh
source ops/ensure-prometheus.sh
source ops/ensure-alertmanager.sh
source ops/ensure-chromium.sh
source ops/ensure-python.sh
bash ops/check-prometheus.sh
cargo test --locked "$@"
