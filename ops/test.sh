#!/usr/bin/env bash
# Runs the whole test suite. Tests start their own redis-server processes on
# free loopback ports (and the status page test its own headless Chromium);
# this script only makes sure redis-server and chromium are installed.
set -euo pipefail
cd "$(dirname "$0")/.."
source ops/ensure-redis.sh
source ops/ensure-chromium.sh
cargo test --locked --features tools "$@"
