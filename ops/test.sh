#!/usr/bin/env bash
# Runs the whole test suite. Tests start their own redis-server (and
# prometheus) processes on free loopback ports; this script only makes sure
# redis-server and prometheus are installed, and checks the alert rules first.
set -euo pipefail
cd "$(dirname "$0")/.."
source ops/ensure-redis.sh
source ops/ensure-prometheus.sh
bash ops/check-prometheus.sh
cargo test --locked --features tools "$@"
